"""Local services a run starts itself, supervised: restarted, tied to the run, never reused stale.

:func:`supervise` runs the sandbox, the retriever, launched HTTP MCP servers and
``generate --ray``'s shared ``toolrollout serve``: restarted when they die or stop
answering liveness probes, waited for while they restart, killed with the run and
identified on their port by a record. See docs/fault-tolerance.md#supervised-services.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import IO

import anyio
import httpx
from anyio.abc import Process

from toolrollout._exceptions import ToolUnavailable, UserError
from toolrollout._port_records import (
    LINUX,
    drop_record,
    kill_group,
    start_time,
    write_record,
)

__all__ = [
    "RestartPolicy",
    "ServiceCommand",
    "SupervisedService",
    "dying_with_this_process",
    "supervise",
    "supervised",
    "until_serving",
]

logger = logging.getLogger("toolrollout.services")

_LAUNCHER = (
    "import os,sys\n"
    "if sys.platform.startswith('linux'):\n"
    "    import ctypes\n"
    "    ctypes.CDLL(None).prctl(1, 9)\n"  # PR_SET_PDEATHSIG, SIGKILL
    "    if os.getppid() != int(sys.argv[1]): os._exit(70)\n"  # the run died already
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)
"""Runs as ``python -I -S -c _LAUNCHER <parent pid> <argv...>``: sets the parent-death
signal (anyio cannot set it for an async child), checks the parent did not die before
that, then becomes the service (same pid)."""


def dying_with_this_process(argv: Sequence[str]) -> list[str]:
    """``argv`` behind the launcher: killed when the thread that started it dies (Linux),
    for unsupervised ``subprocess.Popen`` callers (``preexec_fn`` is unsafe with threads)."""
    return [sys.executable, "-I", "-S", "-c", _LAUNCHER, str(os.getpid()), *argv]


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """How often a dead service is started again before it is declared down."""

    max_restarts: int = 5
    """Restarts allowed within :attr:`window` seconds; one more death and it is down."""
    window: float = 300.0
    """Seconds over which restarts are counted."""
    backoff: float = 0.5
    """Seconds before a restart after a failed one (doubled each time, at most 10 s)."""
    probe_interval: float = 2.0
    """Seconds between two liveness probes of a serving service (after each answer)."""
    probe_timeout: float = 5.0
    """Seconds a liveness probe waits for its answer before it counts as a miss."""
    probe_misses: int = 3
    """Probes in a row without an answer that make the service hung (0: no probing)."""
    call_wait: float | None = None
    """Seconds a call waits for a restarting service (None: its ``startup_timeout``)."""

    def __post_init__(self) -> None:
        if (
            self.max_restarts < 0
            or self.window <= 0
            or self.backoff < 0
            or self.probe_interval <= 0
            or self.probe_timeout <= 0
            or self.probe_misses < 0
            or (self.call_wait is not None and self.call_wait < 0)
        ):
            raise UserError(f"invalid RestartPolicy: {self}")


@dataclass(frozen=True, slots=True)
class ServiceCommand:
    """What to run for a service, where it listens and how to tell it is ready."""

    kind: str
    """Short name for logs and records: ``sandbox``, ``retriever``, ``mcp-http``."""
    argv: tuple[str, ...]
    host: str
    """Where to connect to it (a loopback address)."""
    port: int
    ready: Callable[[httpx.AsyncClient], Awaitable[bool]]
    """True once it serves (e.g. its health endpoint answers 200 to the client given)."""
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    startup_timeout: float = 60.0
    startup_error: Callable[[int | None, str], Exception] | None = None
    """The error of a failed start, from the exit status (None: not ready in time) and the
    output; default :class:`ToolUnavailable`."""
    live: Callable[[httpx.AsyncClient], Awaitable[bool]] | None = None
    """The liveness probe (None: :attr:`ready`); it must need the service's own code to
    answer (the kernel accepts TCP connections for a stopped process)."""

    @property
    def label(self) -> str:
        return f"the {self.kind} on port {self.port}"


@dataclass(eq=False)
class SupervisedService:
    """A running supervised service: its current process, and what happened to it."""

    command: ServiceCommand
    policy: RestartPolicy
    pids: list[int] = field(default_factory=list)
    """Every process started for it, in order (the last one is the current one)."""
    restarts: int = 0
    down: bool = False
    """True once it died more often than the policy allows; it stays down."""
    restart_seconds: list[float] = field(default_factory=list)
    """Seconds from each death to the service being ready again."""
    hangs: int = 0
    """Times it was found hung (no answer to its liveness probes) and killed."""
    calls_waited: int = 0
    """Calls that arrived while it was restarting and waited for it (:meth:`until_serving`)."""
    _process: Process | None = None
    _log: IO[bytes] | None = None
    _serving: anyio.Event = field(default_factory=anyio.Event)
    """Set while a process of it is ready and not known dead; a new one for each outage."""
    _hung: str | None = None
    """Why the probe killed the current process (None: it did not)."""
    _faults: dict[int, str] = field(default_factory=dict)
    """Why each process that is gone went, by :attr:`generation` (for calls' errors)."""
    _waiting: int = 0
    """Calls waiting for the current outage to end."""
    _closed: bool = False
    """Set when the run leaves it: no call waits for it any more."""
    _thread: int = field(default_factory=threading.get_ident)
    """The thread whose event loop supervises it (only its calls may wait on it)."""

    @property
    def pid(self) -> int:
        """The current process id."""
        return self.pids[-1]

    @property
    def generation(self) -> int:
        """How many processes were started for it (1 until its first restart)."""
        return len(self.pids)

    @property
    def serving(self) -> bool:
        """Whether it is up now (ready, and not found dead or hung since)."""
        return self._serving.is_set() and not self.down and not self._closed

    @property
    def call_wait(self) -> float:
        """Seconds a call waits for a restart (:attr:`RestartPolicy.call_wait`)."""
        wait = self.policy.call_wait
        return self.command.startup_timeout if wait is None else wait

    async def until_serving(self) -> bool:
        """Wait while it is restarting, at most :attr:`call_wait` seconds; whether it is
        serving now."""
        if self.serving and LINUX and start_time(self.pid) is None:
            # Dead already, the supervisor has not noticed yet (milliseconds): wait for the
            # restart all the same, nothing was sent to it.
            return await self.until_replaced(self.generation)
        if self.serving or self.down or self._closed:
            return self.serving
        self.calls_waited += 1
        self._waiting += 1
        try:
            with anyio.move_on_after(self.call_wait):
                await self._serving.wait()
        finally:
            self._waiting -= 1
        return self.serving

    async def until_replaced(self, generation: int) -> bool:
        """After a call found the process of ``generation`` gone (connection refused): wait
        until a later one serves, at most :attr:`call_wait` seconds; whether one does."""
        self.calls_waited += 1
        self._waiting += 1
        try:
            with anyio.move_on_after(self.call_wait):
                while not (self.down or self._closed):
                    if self.generation > generation and self.serving:
                        return True
                    if self._serving.is_set():  # its death is not noticed yet (ms)
                        await anyio.sleep(0.02)
                    else:
                        await self._serving.wait()
        finally:
            self._waiting -= 1
        return False

    def fault(self, generation: int) -> str | None:
        """What happened to the process of ``generation``, as ``the sandbox on port N: pid
        P died...``; None while it serves (or its death is not noticed yet)."""
        cause = self._faults.get(generation)
        return None if cause is None else f"{self.command.label}: {cause}"

    def _outage(self) -> None:
        """The current process is dead or hung: later calls wait for the next one."""
        if self._serving.is_set():
            self._serving = anyio.Event()

    def output(self) -> str:
        """What the current process printed so far."""
        if self._log is None:
            return ""
        self._log.flush()
        self._log.seek(0)
        return self._log.read().decode("utf-8", errors="replace").strip()

    async def _start(self) -> None:
        """Start a process and wait until it is ready; on failure stop it and raise."""
        command = self.command
        if self._log is not None:
            self._log.close()
        self._log = tempfile.TemporaryFile()
        argv = dying_with_this_process(command.argv)
        process = await anyio.open_process(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=dict(command.env) if command.env is not None else None,
            cwd=command.cwd,
            start_new_session=True,
        )
        self._process = process
        self.pids.append(process.pid)
        ready = False
        with anyio.move_on_after(command.startup_timeout):
            async with httpx.AsyncClient(timeout=2.0) as client:
                while process.returncode is None:
                    with suppress(Exception):
                        ready = await command.ready(client)
                    if ready:
                        break
                    await anyio.sleep(0.05)
        if ready and process.returncode is None:
            write_record(command.kind, command.port, command.argv, process.pid)
            return
        status = process.returncode
        await self._stop()
        text = self.output()
        if command.startup_error is not None:
            raise command.startup_error(status, text)
        if status is None:
            raise ToolUnavailable(
                f"{command.label} was not ready within {command.startup_timeout:g} s: "
                + text[-500:]
            )
        last = text.splitlines()[-1] if text else f"exit status {status}"
        raise ToolUnavailable(f"{command.label} exited at startup: {last}")

    async def _stop(self) -> None:
        """Stop the current process and its group: SIGTERM, SIGKILL after 5 s (shielded)."""
        process = self._process
        if process is None:
            return
        with anyio.CancelScope(shield=True):
            if process.returncode is None:
                kill_group(process.pid, signal.SIGTERM)
                with anyio.move_on_after(5.0):
                    await process.wait()
            kill_group(process.pid, signal.SIGKILL)  # whatever is left of its group
            if process.returncode is None:
                await process.wait()
            await process.aclose()
            drop_record(self.command.port, process.pid)

    async def _watch(self) -> None:
        """Restart the service each time it dies, within the policy; never raises."""
        deaths: list[float] = []
        label = self.command.label
        while True:
            process = self._process
            assert process is not None
            await process.wait()
            died = time.monotonic()
            self._outage()
            kill_group(process.pid, signal.SIGKILL)  # its group goes with it
            await process.aclose()
            drop_record(self.command.port, process.pid)
            self._process = None
            deaths = [t for t in deaths if died - t < self.policy.window] + [died]
            if self._hung is not None:
                cause, self._hung = self._hung, None
            else:
                cause = f"pid {process.pid} died, exit status {process.returncode}"
            self._faults.setdefault(self.generation, cause)
            failures = 0
            while True:
                if len(deaths) > self.policy.max_restarts:
                    self.down = True
                    self._serving.set()  # wakes the calls waiting: they find it down
                    logger.error(
                        "%s: %s; it died %d times within %g s: declared down, its calls "
                        "fail as unavailable for the rest of the run",
                        label,
                        cause,
                        len(deaths),
                        self.policy.window,
                    )
                    return
                self.restarts += 1
                logger.warning(
                    "%s: %s; restarting it (restart %d, at most %d per %g s)",
                    label,
                    cause,
                    self.restarts,
                    self.policy.max_restarts,
                    self.policy.window,
                )
                try:
                    await self._start()
                except Exception as exc:
                    failures += 1
                    cause = f"the restart failed: {exc}"
                    deaths.append(time.monotonic())
                    await anyio.sleep(min(self.policy.backoff * 2 ** (failures - 1), 10.0))
                    continue
                self.restart_seconds.append(time.monotonic() - died)
                waiting = self._waiting
                self._serving.set()
                logger.warning(
                    "%s is back (pid %d), %.2f s after it died; %d call(s) were waiting for it",
                    label,
                    self.pid,
                    self.restart_seconds[-1],
                    waiting,
                )
                break

    async def _probe(self) -> None:
        """Kill the current process when it stops answering its liveness probe; never
        raises. The watcher then restarts it as after any death."""
        policy = self.policy
        if policy.probe_misses == 0:
            return
        live = self.command.live or self.command.ready
        while True:
            await anyio.sleep(policy.probe_interval)
            process = self._process
            if process is None or not self.serving:
                continue
            misses = 0
            # One client per process: a pooled connection never outlives its server.
            async with httpx.AsyncClient(timeout=policy.probe_timeout) as client:
                while self._process is process and process.returncode is None:
                    answered = False
                    with anyio.move_on_after(policy.probe_timeout), suppress(Exception):
                        answered = await live(client)
                    misses = 0 if answered else misses + 1
                    if misses >= policy.probe_misses and self._process is process:
                        self.hangs += 1
                        self._hung = (
                            f"pid {process.pid} stopped answering ({misses} liveness probes in "
                            f"a row got no answer within {policy.probe_timeout:g} s); killed it"
                        )
                        self._faults[self.generation] = self._hung
                        self._outage()
                        kill_group(process.pid, signal.SIGKILL)
                        break
                    await anyio.sleep(policy.probe_interval)


@asynccontextmanager
async def supervise(
    command: ServiceCommand, policy: RestartPolicy | None = None
) -> AsyncIterator[SupervisedService]:
    """Run ``command`` as a supervised service for the ``async with`` body (started and
    ready, else its startup error); stopped with its process group on leaving. The caller
    checks the port first (:func:`claim_port`)."""
    service = SupervisedService(command, policy or RestartPolicy())
    try:
        await service._start()
        service._serving.set()
        _running[command.port] = service
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(service._watch)
                group.start_soon(service._probe)
                try:
                    yield service
                finally:
                    group.cancel_scope.cancel()
        except BaseExceptionGroup as group_error:  # the body's error, as the body raised it
            if len(group_error.exceptions) == 1:
                raise group_error.exceptions[0] from None
            raise
    finally:
        if _running.get(command.port) is service:
            del _running[command.port]
        service._closed = True  # calls waiting for it stop waiting
        service._serving.set()
        await service._stop()
        if service._log is not None:
            service._log.close()


_running: dict[int, SupervisedService] = {}
"""The services this process supervises now, by port."""


def supervised(port: int) -> SupervisedService | None:
    """The service this process supervises on ``port`` (None: none), if it is supervised
    from the calling thread's event loop."""
    service = _running.get(port)
    if service is None or service._thread != threading.get_ident():
        return None
    return service


async def until_serving(port: int) -> SupervisedService | None:
    """Before a call to a local service on ``port``: if this process supervises it and it
    is restarting, wait until it is back (bounded); the service, or None. Cheap when it
    serves (one read of ``/proc``)."""
    service = supervised(port)
    if service is not None:
        await service.until_serving()
    return service
