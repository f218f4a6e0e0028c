"""One sandboxed process of a run: fed its stdin, its output read (the first
``max_output_bytes`` of each stream kept), killed with its process group at its timeout
(and, without a PID namespace, once it ended, so no leftover survives it)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import anyio
import anyio.abc

from toolrollout._port_records import kill_group

from ._protocol import CommandRunResult, CommandRunStatus

__all__ = ["execute", "wait_uid_gone"]

logger = logging.getLogger("toolrollout.sandbox._runner")

DRAIN_GRACE = 1.0
"""Seconds to finish reading output after the program ended (a leftover process still
holding the pipe, possible only without isolation, is not waited for longer)."""


@dataclass
class Capture:
    """Reads a stream to its end, keeping the first ``limit`` bytes."""

    limit: int
    data: bytearray = field(default_factory=bytearray)
    dropped: int = 0
    done: anyio.Event = field(default_factory=anyio.Event)

    async def drain(self, stream: anyio.abc.ByteReceiveStream | None) -> None:
        try:
            if stream is None:
                return
            async for chunk in stream:
                room = max(self.limit - len(self.data), 0)
                self.data += chunk[:room]
                self.dropped += max(len(chunk) - room, 0)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
        finally:
            self.done.set()

    def text(self) -> str:
        text = bytes(self.data).decode("utf-8", errors="replace")
        if self.dropped:
            text += f"\n[truncated: {self.dropped} more bytes not shown]\n"
        return text


async def feed(stream: anyio.abc.ByteSendStream | None, data: str | None) -> None:
    if stream is None:
        return
    try:
        if data:
            await stream.send(data.encode("utf-8"))
    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
        pass  # the program exited (or closed stdin) without reading it all
    finally:
        try:
            await stream.aclose()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass


def uid_has_processes(uid: int) -> bool:
    wanted = str(uid)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", encoding="ascii", errors="replace") as status:
                for line in status:
                    if line.startswith("Uid:"):
                        if line.split()[1] == wanted:
                            return True
                        break
        except OSError:
            continue
    return False


def wait_uid_gone(uid: int, seconds: float) -> None:
    """Wait until no process runs as ``uid`` (a killed sandbox's processes take a moment to
    die), so RLIMIT_NPROC of the next run on that uid starts from zero."""
    deadline = time.monotonic() + seconds
    while uid_has_processes(uid):
        if time.monotonic() > deadline:
            logger.warning("sandbox: processes of uid %d are still alive", uid)
            return
        time.sleep(0.01)


async def execute(
    argv: list[str],
    *,
    pass_fd: int | None,
    cwd: str,
    env: Mapping[str, str],
    stdin: str | None,
    run_timeout: float,
    max_output_bytes: int,
    isolated: bool,
) -> CommandRunResult:
    """Run ``argv`` until it ends or ``run_timeout`` passes (see the module docs)."""
    out, err = Capture(max_output_bytes), Capture(max_output_bytes)
    started = time.perf_counter()
    try:
        process = await anyio.open_process(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=env,
            start_new_session=True,
            pass_fds=() if pass_fd is None else (pass_fd,),
        )
    except OSError as exc:
        return CommandRunResult(
            status=CommandRunStatus.Error, stderr=f"cannot start the sandbox: {exc}"
        )
    finally:
        if pass_fd is not None:
            os.close(pass_fd)
    spawned = time.perf_counter()
    timed_out = False
    elapsed = 0.0
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(feed, process.stdin, stdin)
            tg.start_soon(out.drain, process.stdout)
            tg.start_soon(err.drain, process.stderr)
            with anyio.move_on_after(run_timeout) as scope:
                await process.wait()
            elapsed = time.perf_counter() - started
            # A busy event loop can see the exit and the deadline in one turn; a command
            # that outlived its limit timed out either way.
            if scope.cancelled_caught or time.perf_counter() - spawned > run_timeout:
                timed_out = True
                kill_group(process.pid, signal.SIGKILL, leader=False)
                await process.wait()
            elif not isolated:  # background leftovers of a finished program
                kill_group(process.pid, signal.SIGKILL, leader=False)
            with anyio.move_on_after(DRAIN_GRACE):
                await out.done.wait()
                await err.done.wait()
            tg.cancel_scope.cancel()
    finally:
        if process.returncode is None:  # cancelled from outside: leave nothing behind
            kill_group(process.pid, signal.SIGKILL, leader=False)
            with anyio.CancelScope(shield=True):
                await process.wait()
        with anyio.CancelScope(shield=True):
            await process.aclose()
    if timed_out:
        return CommandRunResult(
            status=CommandRunStatus.TimeLimitExceeded,
            execution_time=elapsed,
            stdout=out.text(),
            stderr=err.text(),
        )
    code = process.returncode
    if code is not None and code < 0:
        code = 128 - code  # killed by a signal: report it as bwrap (and a shell) do
    return CommandRunResult(
        status=CommandRunStatus.Finished,
        execution_time=elapsed,
        return_code=code,
        stdout=out.text(),
        stderr=err.text(),
    )
