"""One MCP server's connection: its current session, the calls on it with a watchdog
(heartbeat pings on HTTP, progress idle timeout), and their errors translated."""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, Protocol, cast
from urllib.parse import urlsplit

import anyio
import anyio.abc
import httpx2
from mcp import ClientSession
from mcp.shared.exceptions import MCPError
from mcp.types import (
    CONNECTION_CLOSED,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    REQUEST_TIMEOUT,
    CallToolResult,
    Implementation,
    RequestParamsMeta,
)
from pydantic import ValidationError

from toolrollout._exceptions import (
    ToolArgumentError,
    ToolExecutionError,
    ToolRolloutError,
    ToolTimeout,
    ToolUnavailable,
)
from toolrollout._supervisor import until_serving
from toolrollout._version import __version__

from ._servers import HttpServer, McpServerSpec, StdioServer
from ._session import Session, WatchedReadStream, list_all_tools, open_streams

__all__ = ["McpServerStatistics", "ServerConnection", "describe"]

logger = logging.getLogger(__name__)

_SESSION_LOST = ("session not found", "session terminated")
"""Streamable HTTP answers (lower-cased) for a session id the server no longer knows,
e.g. after it restarted."""
_STALE_SESSION = re.compile(r"no valid session|session (id )?(not found|expired|unknown)", re.I)
_PROBED_CODES = (CONNECTION_CLOSED, INTERNAL_ERROR)
"""JSON-RPC codes after which the session itself is asked (a ping) whether it lives: the
SDK's code for a closed connection, and the one it reports for an HTTP error status
without a JSON-RPC body (a restarted server answering a stale session id with 400)."""
_RATE_LIMITED = re.compile(r"rate.?limit|too many requests", re.IGNORECASE)
_PING_TIMEOUT = 5.0
_WATCH_STEP = 1.0
"""Seconds between a call's checks of its session when no shorter interval is set."""
_TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (
    anyio.ClosedResourceError,
    anyio.BrokenResourceError,
    anyio.EndOfStream,
    OSError,
    httpx2.TransportError,
)


@dataclass(frozen=True, slots=True)
class McpServerStatistics:
    """Counters of one server's connection since the manager was created."""

    name: str
    connected: bool
    """Whether a live session is open now."""
    sessions_opened: int
    """Sessions established (1 unless the session was lost and re-established)."""
    connect_failures: int
    """Attempts to connect that failed (each failed the calls waiting for it)."""
    sessions_lost: int
    """Sessions found dead: the process exited, the connection dropped, the server restarted."""
    calls: int
    """Tool calls sent on a session."""
    failed_calls: int
    """Calls that raised (transport, protocol or rate-limit errors); ``isError`` results
    are answers, not failures, and are not counted here."""
    in_flight: int
    """Calls waiting for their answer now."""
    progress_notifications: int = 0
    """Progress notifications received for calls."""


class _Manager(Protocol):
    """What a connection reads of its :class:`~._manager.McpClientManager`."""

    @property
    def client_name(self) -> str: ...
    @property
    def connect_timeout(self) -> float: ...
    @property
    def progress_idle_timeout(self) -> float | None: ...
    @property
    def heartbeat_interval(self) -> float | None: ...
    @property
    def roots(self) -> tuple[Any, ...]: ...
    @property
    def sampling_callback(self) -> object: ...
    @property
    def elicitation_callback(self) -> object: ...
    def _check_open(self) -> None: ...
    def _spawn(self, func: Any, session: Session, name: str) -> None: ...
    async def _list_roots(self, context: Any) -> Any: ...
    async def _sample(self, context: Any, params: Any) -> Any: ...
    async def _elicit(self, context: Any, params: Any) -> Any: ...


class ServerConnection:
    """The connection state of one server: the current session and the counters."""

    def __init__(self, spec: McpServerSpec, manager: _Manager) -> None:
        self.spec = spec
        self.manager = manager
        self.session: Session | None = None
        self.generation = 0
        self.lock: anyio.Lock | None = None
        self.sessions_opened = 0
        self.connect_failures = 0
        self.sessions_lost = 0
        self.calls = 0
        self.failed_calls = 0
        self.in_flight = 0
        self.progress_notifications = 0

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def launched_port(self) -> int | None:
        """The local port of a server the run starts itself; None otherwise."""
        spec = self.spec
        if isinstance(spec, HttpServer) and spec.command is not None:
            return urlsplit(spec.url).port
        return None

    def snapshot(self) -> McpServerStatistics:
        session = self.session
        return McpServerStatistics(
            name=self.name,
            connected=session is not None
            and session.client is not None
            and not session.replaceable,
            sessions_opened=self.sessions_opened,
            connect_failures=self.connect_failures,
            sessions_lost=self.sessions_lost,
            calls=self.calls,
            failed_calls=self.failed_calls,
            in_flight=self.in_flight,
            progress_notifications=self.progress_notifications,
        )

    def _mark_lost(self, session: Session) -> None:
        if not session.lost and not session.stop.is_set():
            session.lost = True
            self.sessions_lost += 1
            logger.warning(
                "MCP server %r (%s): session lost; the next call reconnects",
                self.name,
                self.spec.describe(),
            )
        session.retire()

    async def acquire(self) -> Session:
        """The live session, connecting first (once, under the lock) if there is none; for
        a launched server, waiting while it restarts and never using a session of an earlier
        process of it."""
        self.manager._check_open()
        supervised = await until_serving(self.launched_port) if self.launched_port else None
        served_by = None if supervised is None else supervised.generation
        serving = supervised is not None and supervised.serving
        session = await self._session_on(served_by)
        if (
            session.client is None
            and supervised is not None
            and served_by is not None
            and serving
            and _refused(session.error)
            and await supervised.until_replaced(served_by)
        ):
            session = await self._session_on(supervised.generation)
        if session.client is None:
            error = session.error
            reason = "closed while connecting" if error is None else describe(error)
            raise ToolUnavailable(
                f"cannot connect to MCP server {self.name!r} ({self.spec.describe()}): {reason}"
            ) from error
        return session

    async def _session_on(self, served_by: int | None) -> Session:
        """The current session, or a new one (connected, or failed: ``client`` None)."""
        if self.lock is None:
            self.lock = anyio.Lock()
        async with self.lock:
            session = self.session
            stale = session is not None and session.served_by != served_by
            if session is None or session.replaceable or stale:
                if session is not None:
                    if stale and not session.replaceable:
                        logger.info("MCP server %r was restarted; opening a new session", self.name)
                    session.retire()
                self.generation += 1
                session = Session(self.generation)
                session.served_by = served_by
                self.session = session
                self.manager._spawn(self._run, session, f"mcp:{self.name}")
        await session.ready.wait()
        return session

    async def _open(self, stack: AsyncExitStack, session: Session) -> ClientSession:
        read, write = await open_streams(stack, self.spec)

        def on_end() -> None:
            if session.client is not None:
                self._mark_lost(session)

        manager = self.manager
        client = ClientSession(
            WatchedReadStream(read, on_end),
            write,
            client_info=Implementation(name=manager.client_name, version=__version__),
            list_roots_callback=manager._list_roots if manager.roots else None,
            sampling_callback=manager._sample if manager.sampling_callback else None,
            elicitation_callback=manager._elicit if manager.elicitation_callback else None,
        )
        return await stack.enter_async_context(client)

    async def _run(self, session: Session) -> None:
        """Background task: connect, serve until told to stop (or the connection ends)."""
        timeout = self.manager.connect_timeout
        try:
            # The deadline is on the scope around the whole exit stack, not on a scope
            # inside it: the transport's task groups must exit inside the scope they
            # were entered in.
            session.scope.deadline = anyio.current_time() + timeout
            with session.scope:
                async with AsyncExitStack() as stack:
                    client = await self._open(stack, session)
                    await client.initialize()
                    session.tools = await list_all_tools(client)
                    session.scope.deadline = math.inf
                    session.client = client
                    self.sessions_opened += 1
                    logger.debug("MCP server %r: session %d open", self.name, session.generation)
                    session.ready.set()
                    await session.stop.wait()
        except Exception as exc:
            if session.client is None:
                session.error = exc
                self.connect_failures += 1
                logger.debug("MCP server %r: connecting failed: %s", self.name, describe(exc))
            elif not session.stop.is_set() or session.lost:
                self._mark_lost(session)
                logger.debug("MCP server %r: session ended: %s", self.name, describe(exc))
            else:
                logger.debug("MCP server %r: error while closing: %s", self.name, describe(exc))
        finally:
            if session.client is None and session.error is None and not session.stop.is_set():
                session.error = TimeoutError(f"timed out after {timeout:g}s")
                self.connect_failures += 1
            session.closed.set()
            session.ready.set()

    async def call(
        self, name: str, arguments: Mapping[str, Any], meta: Mapping[str, Any] | None
    ) -> CallToolResult:
        session = await self.acquire()
        client = session.client
        assert client is not None
        manager = self.manager
        idle_timeout = manager.progress_idle_timeout
        heartbeat = None if isinstance(self.spec, StdioServer) else manager.heartbeat_interval
        last_sign = anyio.current_time()
        verdict: ToolRolloutError | None = None
        raised: Exception | None = None
        result: Any = None
        where = f"MCP tool {name!r} on server {self.name!r}"

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            nonlocal last_sign
            last_sign = anyio.current_time()
            self.progress_notifications += 1

        async def watch(scope: anyio.CancelScope) -> None:
            # Stdio needs no ping: a dead process ends the stream, which retires the session.
            nonlocal verdict
            steps = [x for x in (heartbeat, idle_timeout, _WATCH_STEP) if x is not None]
            step = min(steps)
            while True:
                await anyio.sleep(step)
                if session.replaceable:
                    verdict = ToolUnavailable(f"{where}: the session was lost during the call")
                elif idle_timeout is not None and anyio.current_time() - last_sign > idle_timeout:
                    verdict = ToolTimeout(
                        f"{where} sent no progress for {idle_timeout:g}s "
                        "(mcp.progress_idle_timeout)"
                    )
                elif heartbeat is not None and not await self._heartbeat(session, heartbeat):
                    self._mark_lost(session)
                    verdict = ToolUnavailable(
                        f"{where}: the server stopped answering on this session during the "
                        "call (heartbeat ping failed); the next call reconnects"
                    )
                if verdict is not None:
                    scope.cancel()
                    return

        self.calls += 1
        self.in_flight += 1
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch, tg.cancel_scope)
                try:
                    result = await client.call_tool(
                        name,
                        dict(arguments),
                        progress_callback=on_progress,
                        meta=None if meta is None else cast(RequestParamsMeta, dict(meta)),
                    )
                except Exception as exc:  # kept out of the task group's exception group
                    raised = exc
                tg.cancel_scope.cancel()
            if raised is None and result is None and verdict is not None:
                raise verdict  # an answer that came as the watchdog fired still counts
            if raised is not None:
                raise await self._translate(session, raised, name) from raised
        except Exception:
            self.failed_calls += 1
            raise
        finally:
            self.in_flight -= 1
        if not isinstance(result, CallToolResult):  # only with allow_* flags, never set here
            raise ToolExecutionError(
                f"MCP tool {name!r} on server {self.name!r} returned "
                f"{type(result).__name__}, not a tool result"
            )
        return result

    async def _heartbeat(self, session: Session, interval: float) -> bool:
        """False when a ping *fails* (a slow one is alive); one ping at a time per session,
        none within ``interval`` of the last success."""
        if session.replaceable or session.client is None:
            return False
        if anyio.current_time() - session.alive_at < interval:
            return True
        probe = session.probe
        if probe is not None:
            await probe.wait()
            return not session.probe_failed
        probe = session.probe = anyio.Event()
        failed = False
        try:
            with anyio.move_on_after(_PING_TIMEOUT):
                await session.client.send_ping()
                session.alive_at = anyio.current_time()
        except Exception as exc:
            failed = True
            logger.debug("MCP server %r: heartbeat ping failed: %s", self.name, describe(exc))
        finally:
            session.probe_failed = failed
            session.probe = None
            probe.set()
        return not failed

    async def _alive(self, session: Session) -> bool:
        if session.replaceable or session.client is None:
            return False
        try:
            with anyio.fail_after(_PING_TIMEOUT):
                await session.client.send_ping()
        except Exception:
            return False
        return True

    async def _translate(self, session: Session, exc: Exception, name: str) -> ToolRolloutError:
        """Map an exception out of ``call_tool`` into the tree (the caller chains it)."""
        where = f"MCP tool {name!r} on server {self.name!r}"
        if isinstance(exc, MCPError):
            code, message = exc.error.code, exc.error.message
            lost = message.strip().lower() in _SESSION_LOST or bool(_STALE_SESSION.search(message))
            if code in _PROBED_CODES and not lost:
                # Also codes a tool's own failure may use: ask the session whether it lives.
                lost = not await self._alive(session)
            if lost:
                self._mark_lost(session)
                return ToolUnavailable(
                    f"{where}: the session was lost ({message}); the next call reconnects"
                )
            if code == 429 or _RATE_LIMITED.search(message):
                return ToolUnavailable(f"{where} is rate limited: {message}")
            if code == REQUEST_TIMEOUT:
                return ToolTimeout(f"{where} timed out: {message}")
            if code == INVALID_PARAMS:
                return ToolArgumentError(f"{where} rejected the call: {message}")
            return ToolExecutionError(f"{where} failed with JSON-RPC error {code}: {message}")
        if isinstance(exc, ValidationError):
            first = exc.errors()[0] if exc.errors() else {"msg": str(exc), "loc": ()}
            place = ".".join(str(part) for part in first["loc"]) or "result"
            return ToolExecutionError(
                f"{where} returned a malformed result: {place}: {first['msg']}"
            )
        if isinstance(exc, _TRANSPORT_ERRORS) or isinstance(exc, ExceptionGroup):
            self._mark_lost(session)
            return ToolUnavailable(f"{where}: the connection failed: {describe(exc)}")
        return ToolExecutionError(f"{where} failed: {describe(exc)}")


def _refused(exc: BaseException | None) -> bool:
    """Whether connecting failed because nothing listened (looking through groups)."""
    if isinstance(exc, BaseExceptionGroup):
        return any(_refused(e) for e in exc.exceptions)
    return isinstance(exc, ConnectionRefusedError | httpx2.ConnectError)


def describe(exc: BaseException) -> str:
    """One line for an exception, looking through exception groups."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, TimeoutError) and not str(exc):
        return "timed out"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
