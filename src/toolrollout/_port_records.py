"""Which process serves a local service's port: the records of the services a run starts,
and :func:`claim_port`, which makes a port ready for a new one.

A record (``<state dir>/<port>.json``: pid, start time, owner pid) is written for each
service started (:mod:`toolrollout._supervisor`). A server found on the port when a run
opens the service is replaced when the record shows it is a service whose run is gone
(stale), used when it is one of this run's, and anything else there is a one-line error
naming the port: a run never silently talks to a server it did not start.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

import anyio

from toolrollout._exceptions import UserError
from toolrollout._jsonarg import json_file_object
from toolrollout._net import is_listening

__all__ = [
    "LINUX",
    "claim_or_start",
    "claim_port",
    "drop_record",
    "kill_group",
    "record_path",
    "start_time",
    "state_dir",
    "write_record",
]

logger = logging.getLogger("toolrollout.services")

T = TypeVar("T")


def state_dir() -> Path:
    """Where service records live (per user): ``$XDG_RUNTIME_DIR/toolrollout/services`` or
    the temporary folder's ``toolrollout-<uid>/services``."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    root = (
        Path(base) / "toolrollout"
        if base
        else Path(tempfile.gettempdir()) / (f"toolrollout-{os.getuid()}")
    )
    return root / "services"


def record_path(port: int) -> Path:
    """The record of the service started on ``port`` (it may not exist)."""
    return state_dir() / f"{port}.json"


LINUX = sys.platform.startswith("linux")
"""Whether ``/proc`` tells whether a process lives (elsewhere a call does not ask)."""


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (None: no such live process)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def _same_process(pid: Any, start: Any) -> bool:
    return isinstance(pid, int) and pid > 0 and start is not None and start_time(pid) == start


def write_record(kind: str, port: int, argv: Sequence[str], pid: int) -> None:
    """Record that ``pid`` (started by this process from ``argv``) serves ``port``."""
    path = record_path(port)
    record = {
        "kind": kind,
        "port": port,
        "pid": pid,
        "pid_start": start_time(pid),
        "owner": os.getpid(),
        "owner_start": start_time(os.getpid()),
        "argv": list(argv),
        "started": time.time(),
    }
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record), encoding="utf-8")
    tmp.replace(path)


def drop_record(port: int, pid: int) -> None:
    record = json_file_object(record_path(port))
    if record is not None and record.get("pid") == pid and record.get("owner") == os.getpid():
        with suppress(OSError):
            record_path(port).unlink()


def kill_group(pid: int, sig: int, *, leader: bool = True) -> None:
    """Signal the process group ``pid`` leads, and the leader itself unless ``leader`` is
    False (a leader already reaped: its pid may belong to another process by now)."""
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
    if leader:
        with suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


# The command-line words of a service a user starts by hand (``toolrollout sandbox serve``,
# ``toolrollout retriever serve``): such a server has no record, and is told apart from a
# foreign process by what runs it.
_HAND_STARTED = {"sandbox": ("sandbox", "serve"), "retriever": ("retriever", "serve")}


def _listening_pid(port: int) -> int | None:
    """The pid of the process listening on TCP ``port`` (Linux ``/proc``), if visible."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if (
                    len(fields) > 9
                    and fields[3] == "0A"
                    and int(fields[1].rsplit(":", 1)[1], 16) == port
                ):
                    inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with suppress(OSError):
            for fd in (entry / "fd").iterdir():
                with suppress(OSError):
                    if os.readlink(fd) in inodes:
                        return int(entry.name)
    return None


def _hand_started(kind: str, port: int) -> tuple[int, str] | None:
    """``(pid, command line)`` when a ``toolrollout`` server of ``kind`` that no run started
    (so, one a user started by hand) listens on ``port``."""
    words = _HAND_STARTED.get(kind)
    pid = _listening_pid(port) if words is not None else None
    if words is None or pid is None:
        return None
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None
    names = [Path(a).name for a in argv]
    if any(n.startswith("toolrollout") for n in names) or "toolrollout" in argv:
        if all(word in argv for word in words):
            return pid, " ".join(a for a in argv if a)
    return None


async def claim_port(kind: str, host: str, port: int, argv: Sequence[str] | None = None) -> bool:
    """Make ``port`` ready for a new ``kind`` service of this run.

    Returns True when a live ``kind`` service of this process, or one of another live
    toolrollout process started with the same ``argv`` (the workers of one ``--ray`` run
    share one), already serves there: the caller uses it. A stale service (its run is
    gone) is killed and False returned once the port is free. Raises
    :class:`~toolrollout.UserError` (one line) for a service of another live run with
    other settings, and for any other process on the port.
    """
    record = json_file_object(record_path(port))
    known = record is not None and _same_process(record.get("pid"), record.get("pid_start"))
    listening = await is_listening(host, port)
    if not listening and not known:
        return False
    if known and record is not None:
        pid = int(record["pid"])
        owner_alive = _same_process(record.get("owner"), record.get("owner_start"))
        if owner_alive and record.get("owner") == os.getpid():
            if record.get("kind") == kind and listening:
                return True
            raise UserError(
                f"port {port}: this run already serves its {record.get('kind')} there; "
                f"give the {kind} another port"
            )
        same = record.get("kind") == kind and argv is not None and record.get("argv") == list(argv)
        if owner_alive and same and listening:
            logger.info(
                "port %d: using the %s (pid %d) of toolrollout process %s, started with the "
                "same settings",
                port,
                kind,
                pid,
                record.get("owner"),
            )
            return True
        if owner_alive:
            raise UserError(
                f"port {port} on {host} is in use by the {record.get('kind')} of another "
                f"running toolrollout process (pid {record.get('owner')}) with other "
                "settings; give this run another port"
            )
        logger.warning(
            "port %d: replacing a stale %s (pid %d) left by an earlier run (pid %s, gone)",
            port,
            record.get("kind"),
            pid,
            record.get("owner"),
        )
        kill_group(pid, signal.SIGKILL)
        with anyio.move_on_after(10):
            while start_time(pid) is not None or await is_listening(host, port):  # noqa: ASYNC110
                await anyio.sleep(0.05)
        with suppress(OSError):
            record_path(port).unlink()
        if not await is_listening(host, port):
            return False
    if not known:
        hand = _hand_started(kind, port)
        if hand is not None:
            logger.warning(
                "port %d: using the %s you started yourself (pid %d: %s); this run does not "
                "supervise or restart it",
                port,
                kind,
                *hand,
            )
            return True
    raise UserError(
        f"port {port} on {host} is in use by a process this run did not start; stop it or "
        "choose another port"
    )


@asynccontextmanager
async def claim_or_start(
    kind: str,
    host: str,
    port: int,
    argv: Sequence[str],
    start: Callable[[], AbstractAsyncContextManager[T]],
) -> AsyncIterator[T | None]:
    """:func:`claim_port`, then ``start()`` a new ``kind`` service for the block; yields
    what it started, or None when this run's own service serves there already (an
    opening inside another)."""
    if await claim_port(kind, host, port, argv):
        logger.info("port %d: using this run's %s, open already", port, kind)
        yield None
        return
    async with start() as started:
        yield started
