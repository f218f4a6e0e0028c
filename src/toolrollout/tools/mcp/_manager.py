"""One persistent MCP session per server, shared by every trajectory, reconnected on loss.

:class:`McpClientManager` owns a task group; each server's session lives in one background
task of it (transport + :class:`mcp.ClientSession`), started lazily by the first call and
replaced, again by the next call, when it is found dead. Calls run in the callers' own
tasks on the shared session, so a caller's cancellation (e.g. the executor's per-call
timeout) cancels the request, and the SDK then sends ``notifications/cancelled`` to the
server. Errors are translated into the library's tree at this boundary.

The client declares a capability only when it can honour it: roots when roots are
configured, sampling and elicitation when a callback for them is (the SDK declares each one
for which a callback is given), so a server offers only tools that can work; server-everything
leaves out ``trigger-sampling-request`` & co. otherwise. A request arriving anyway is refused
by the SDK. Each call asks for progress
notifications; a watchdog next to the call fails it as unavailable when its session is
found dead (a failed heartbeat ping on HTTP, end of stream on stdio) and, if configured,
as timed out when the server sends no progress for ``progress_idle_timeout`` seconds.
"""

from __future__ import annotations

import logging
import math
import os
import re
import sys
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from types import MappingProxyType, TracebackType
from typing import Any, Literal, Self, TextIO, TypeVar, cast
from urllib.parse import urlsplit

import anyio
import anyio.abc
import httpx2
from mcp import ClientSession, StdioServerParameters
from mcp.client.session import ClientRequestContext, ElicitationFnT, SamplingFnT
from mcp.client.sse import sse_client
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp.types import (
    CONNECTION_CLOSED,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    REQUEST_TIMEOUT,
    CallToolResult,
    CreateMessageRequestParams,
    CreateMessageResult,
    CreateMessageResultWithTools,
    ElicitRequestParams,
    ElicitResult,
    ErrorData,
    Implementation,
    ListRootsResult,
    PaginatedRequestParams,
    RequestParamsMeta,
    Root,
)
from mcp.types import Tool as McpToolInfo
from pydantic import ValidationError

from toolrollout._exceptions import (
    ToolArgumentError,
    ToolExecutionError,
    ToolRolloutError,
    ToolTimeout,
    ToolUnavailable,
    UserError,
)
from toolrollout._supervisor import until_serving
from toolrollout._version import __version__

from ._servers import HttpServer, McpServerSpec, StdioServer

__all__ = [
    "ElicitationCallback",
    "McpClientManager",
    "McpRoot",
    "McpServerStatistics",
    "SamplingCallback",
]

SamplingCallback = SamplingFnT
"""``async (context, CreateMessageRequestParams) -> CreateMessageResult | ErrorData``: answers
a server's ``sampling/createMessage`` (the SDK's callback type)."""
ElicitationCallback = ElicitationFnT
"""``async (context, ElicitRequestParams) -> ElicitResult | ErrorData``: answers a server's
``elicitation/create`` (the SDK's callback type)."""

logger = logging.getLogger(__name__)

_A = TypeVar("_A")

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


@dataclass(frozen=True, slots=True)
class McpRoot:
    """A root the client offers servers (``roots/list``): a ``file://`` URI and a name."""

    uri: str
    name: str | None = None


class _WatchedReadStream:
    """The transport's read stream, reporting when the session's reader stops using it.

    The session's receive loop leaves ``async with read_stream`` exactly when the
    connection ends (EOF from a dead process, a dropped HTTP stream, or our own close),
    so a dead session is noticed without waiting for the next call to fail on it.
    """

    def __init__(self, stream: Any, on_end: Any) -> None:
        self._stream = stream
        self._on_end = on_end

    @property
    def last_context(self) -> Any:
        return getattr(self._stream, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        item: SessionMessage | Exception = await self._stream.receive()
        return item

    async def aclose(self) -> None:
        self._on_end()
        await self._stream.aclose()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            item: SessionMessage | Exception = await self._stream.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._on_end()
            raise StopAsyncIteration from None
        return item

    async def __aenter__(self) -> Self:
        await self._stream.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool | None:
        self._on_end()
        result: bool | None = await self._stream.__aexit__(exc_type, exc_val, exc_tb)
        return result


class _Session:
    """One connection (attempt) to a server; replaced, never reused, once it ends."""

    def __init__(self, generation: int) -> None:
        self.generation = generation
        self.ready = anyio.Event()
        """Set once connected, or once connecting failed (then ``client`` is None)."""
        self.stop = anyio.Event()
        """Set to make the background task close the session."""
        self.closed = anyio.Event()
        """Set when the background task has finished (session and transport closed)."""
        self.scope = anyio.CancelScope()
        self.client: ClientSession | None = None
        self.error: BaseException | None = None
        self.tools: list[McpToolInfo] = []
        self.lost = False
        self.alive_at = -math.inf
        """When a heartbeat ping last succeeded (anyio clock)."""
        self.probe: anyio.Event | None = None
        """Set when the heartbeat ping in progress has finished (None: none running)."""
        self.probe_failed = False
        self.served_by: int | None = None
        """For a server this process supervises: the generation of its process that this
        session was opened on (a restarted server has forgotten the session)."""

    @property
    def replaceable(self) -> bool:
        """Ended, ending or failed: the next call must open a new session."""
        return self.lost or self.stop.is_set() or self.closed.is_set()

    def retire(self) -> None:
        self.stop.set()
        if not self.ready.is_set():
            self.scope.cancel()


class _Server:
    """The connection state of one server: the current session and the counters."""

    def __init__(self, spec: McpServerSpec, manager: McpClientManager) -> None:
        self.spec = spec
        self.manager = manager
        self.session: _Session | None = None
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
        """The local port of a server the run starts itself (an HTTP entry with a
        ``command``), which may be supervised by this process; None otherwise."""
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

    def _mark_lost(self, session: _Session) -> None:
        if not session.lost and not session.stop.is_set():
            session.lost = True
            self.sessions_lost += 1
            logger.warning(
                "MCP server %r (%s): session lost; the next call reconnects",
                self.name,
                self.spec.describe(),
            )
        session.retire()

    async def acquire(self) -> _Session:
        """The live session, connecting first (once, under the lock) if there is none.

        A launched server that is restarting is waited for (bounded); a session opened on
        an earlier process of it is replaced before a call is sent on it; a connection it
        refused because its process had just died is made again to the restarted one.
        """
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
            reason = "closed while connecting" if error is None else _describe(error)
            raise ToolUnavailable(
                f"cannot connect to MCP server {self.name!r} ({self.spec.describe()}): {reason}"
            ) from error
        return session

    async def _session_on(self, served_by: int | None) -> _Session:
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
                session = _Session(self.generation)
                session.served_by = served_by
                self.session = session
                self.manager._spawn(self._run, session, f"mcp:{self.name}")
        await session.ready.wait()
        return session

    async def _open(self, stack: AsyncExitStack, session: _Session) -> ClientSession:
        spec = self.spec
        if isinstance(spec, StdioServer):
            params = StdioServerParameters(
                command=spec.command,
                args=list(spec.args),
                env=dict(spec.env) or None,
                cwd=spec.cwd,
            )
            read, write = await stack.enter_async_context(
                stdio_client(params, errlog=_child_stderr())
            )
        elif spec.transport == "sse":
            read, write = await stack.enter_async_context(
                sse_client(
                    spec.url,
                    headers=dict(spec.headers),
                    timeout=spec.timeout,
                    sse_read_timeout=spec.sse_read_timeout,
                )
            )
        else:
            http = await stack.enter_async_context(
                httpx2.AsyncClient(
                    headers=dict(spec.headers),
                    timeout=httpx2.Timeout(spec.timeout, read=spec.sse_read_timeout),
                    # Each call holds a connection until its answer: no pool cap (the
                    # executor's max_concurrency is the cap), or long calls past 100 at
                    # once would wait for a connection and fail the session.
                    limits=httpx2.Limits(max_connections=None, max_keepalive_connections=64),
                )
            )
            read, write = await stack.enter_async_context(
                streamable_http_client(spec.url, http_client=http)
            )

        def on_end() -> None:
            if session.client is not None:
                self._mark_lost(session)

        manager = self.manager
        client = ClientSession(
            _WatchedReadStream(read, on_end),
            write,
            client_info=Implementation(name=manager.client_name, version=__version__),
            list_roots_callback=manager._list_roots if manager.roots else None,
            sampling_callback=manager._sample if manager.sampling_callback else None,
            elicitation_callback=manager._elicit if manager.elicitation_callback else None,
        )
        return await stack.enter_async_context(client)

    async def _run(self, session: _Session) -> None:
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
                    session.tools = await _list_all_tools(client)
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
                logger.debug("MCP server %r: connecting failed: %s", self.name, _describe(exc))
            elif not session.stop.is_set() or session.lost:
                self._mark_lost(session)
                logger.debug("MCP server %r: session ended: %s", self.name, _describe(exc))
            else:
                logger.debug("MCP server %r: error while closing: %s", self.name, _describe(exc))
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

    async def _heartbeat(self, session: _Session, interval: float) -> bool:
        """False when a ping on the session *fails* (not when it is slow: a busy server is
        alive); one ping at a time per session, and none within ``interval`` of the last
        success, however many calls are in flight."""
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
            logger.debug("MCP server %r: heartbeat ping failed: %s", self.name, _describe(exc))
        finally:
            session.probe_failed = failed
            session.probe = None
            probe.set()
        return not failed

    async def _alive(self, session: _Session) -> bool:
        if session.replaceable or session.client is None:
            return False
        try:
            with anyio.fail_after(_PING_TIMEOUT):
                await session.client.send_ping()
        except Exception:
            return False
        return True

    async def _translate(self, session: _Session, exc: Exception, name: str) -> ToolRolloutError:
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
            return ToolUnavailable(f"{where}: the connection failed: {_describe(exc)}")
        return ToolExecutionError(f"{where} failed: {_describe(exc)}")


def _child_stderr() -> TextIO:
    """Where a stdio server's stderr goes: ours, or the process's real one when ``sys.stderr``
    is a stream without a file descriptor (a test runner's capture, some notebooks), which a
    child process cannot write to."""
    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return sys.__stderr__ if sys.__stderr__ is not None else open(os.devnull, "w")
    return sys.stderr


def _refused(exc: BaseException | None) -> bool:
    """Whether connecting failed because nothing listened (looking through groups)."""
    if isinstance(exc, BaseExceptionGroup):
        return any(_refused(e) for e in exc.exceptions)
    return isinstance(exc, ConnectionRefusedError | httpx2.ConnectError)


def _describe(exc: BaseException) -> str:
    """One line for an exception, looking through exception groups."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, TimeoutError) and not str(exc):
        return "timed out"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def _each(names: Iterable[str], func: Callable[[str], Awaitable[None]]) -> None:
    """Run ``func`` for every name concurrently; re-raise the first failure as it is
    (not wrapped in an exception group), after all have finished."""
    errors: list[Exception] = []

    async def run(name: str) -> None:
        try:
            await func(name)
        except Exception as exc:
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        for name in names:
            tg.start_soon(run, name)
    if errors:
        raise errors[0]


async def _list_all_tools(client: ClientSession) -> list[McpToolInfo]:
    tools: list[McpToolInfo] = []
    cursor: str | None = None
    for _ in range(1000):  # a server that pages forever cannot hang us
        params = None if cursor is None else PaginatedRequestParams(cursor=cursor)
        page = await client.list_tools(params=params)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            break
    return tools


class McpClientManager:
    """Owns one persistent session per MCP server, shared by all calls and trajectories.

    Open it with ``async with manager:`` (or ``await manager.start()`` and, from the same
    task, ``await manager.aclose()``). Opening starts nothing: each server's session is
    connected by the first call that needs it. Closing closes every session and stops
    every child process. A lost session (process exited, connection dropped, server
    restarted) is replaced by the next call; the call that found it lost fails with
    :class:`~toolrollout.exceptions.ToolUnavailable`, which the executor's retry policy retries.

    Use it from one event loop.
    """

    def __init__(
        self,
        servers: Mapping[str, McpServerSpec] | Iterable[McpServerSpec],
        *,
        connect_timeout: float = 30.0,
        client_name: str = "toolrollout",
        source: str | None = None,
        roots: Iterable[McpRoot] = (),
        sampling_callback: SamplingCallback | None = None,
        elicitation_callback: ElicitationCallback | None = None,
        callback_timeout: float = 60.0,
        progress_idle_timeout: float | None = None,
        heartbeat_interval: float | None = 10.0,
    ) -> None:
        """``source`` names where the servers came from (a file), for messages.

        ``roots`` answer ``roots/list``; ``sampling_callback`` answers
        ``sampling/createMessage`` and ``elicitation_callback`` answers
        ``elicitation/create``, each within ``callback_timeout`` seconds or refused. Each
        capability is declared to servers only when it is configured (non-empty ``roots``,
        a callback), so servers offer no tool that needs one the client lacks.
        ``progress_idle_timeout`` fails a call as :class:`~toolrollout.exceptions.ToolTimeout`
        when its server sends no progress notification for that long (None: off; the
        executor's per-call timeout bounds every call either way). ``heartbeat_interval``
        is how often an HTTP session with calls in flight is pinged (None: never); a failed
        ping fails those calls as :class:`~toolrollout.exceptions.ToolUnavailable`.
        """
        specs = list(servers.values()) if isinstance(servers, Mapping) else list(servers)
        if not specs:
            raise UserError("an McpClientManager needs at least one server")
        for label, value in (
            ("connect_timeout", connect_timeout),
            ("callback_timeout", callback_timeout),
            ("progress_idle_timeout", progress_idle_timeout),
            ("heartbeat_interval", heartbeat_interval),
        ):
            if value is not None and not value > 0:
                raise UserError(f"{label} must be > 0, got {value}")
        self._servers: dict[str, _Server] = {}
        for spec in specs:
            if spec.name in self._servers:
                raise UserError(f"two MCP servers are named {spec.name!r}")
            self._servers[spec.name] = _Server(spec, self)
        self.connect_timeout = connect_timeout
        """Seconds to start/connect to a server, initialize and list its tools."""
        self.client_name = client_name
        """Client name sent to servers in ``initialize``."""
        self.source = source
        self.roots: tuple[McpRoot, ...] = tuple(roots)
        """Answered to every server's ``roots/list``."""
        self.sampling_callback = sampling_callback
        self.elicitation_callback = elicitation_callback
        self.callback_timeout = callback_timeout
        self.progress_idle_timeout = progress_idle_timeout
        self.heartbeat_interval = heartbeat_interval
        self._task_group: anyio.abc.TaskGroup | None = None
        self._state: Literal["new", "open", "closing", "closed"] = "new"

    def __repr__(self) -> str:
        where = f" from {self.source}" if self.source else ""
        return f"<McpClientManager {sorted(self._servers)}{where} {self._state}>"

    @property
    def servers(self) -> Mapping[str, McpServerSpec]:
        """The servers by name (read-only)."""
        return MappingProxyType({name: s.spec for name, s in self._servers.items()})

    @property
    def is_open(self) -> bool:
        """Whether calls are accepted (between start and aclose)."""
        return self._state == "open"

    async def start(self) -> None:
        """Open the manager's task group; sessions still start lazily, on first use.

        ``aclose()`` must then be awaited in the same task (anyio's rule for task groups).
        """
        if self._state in ("open", "closing"):
            raise UserError(f"{self!r} is already open")
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        self._task_group = task_group
        for server in self._servers.values():
            server.session = None
            server.lock = None  # recreated in this (maybe new) event loop
        self._state = "open"

    async def aclose(self) -> None:
        """Close every session and stop every child process; waits until they are gone.

        Calls still in flight fail with :class:`~toolrollout.exceptions.ToolUnavailable`.
        Idempotent.
        """
        task_group = self._task_group
        if self._state != "open" or task_group is None:
            self._state = "closed"
            return
        self._state = "closing"
        for server in self._servers.values():
            if server.session is not None:
                server.session.retire()
        try:
            await task_group.__aexit__(None, None, None)
        finally:
            self._task_group = None
            self._state = "closed"

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _list_roots(self, context: ClientRequestContext) -> ListRootsResult:
        roots = [Root.model_validate({"uri": r.uri, "name": r.name}) for r in self.roots]
        return ListRootsResult(roots=roots)

    async def _sample(
        self, context: ClientRequestContext, params: CreateMessageRequestParams
    ) -> CreateMessageResult | CreateMessageResultWithTools | ErrorData:
        callback = self.sampling_callback
        assert callback is not None  # the session gets this answerer only with a callback
        return await self._answer("sampling", callback(context, params))

    async def _elicit(
        self, context: ClientRequestContext, params: ElicitRequestParams
    ) -> ElicitResult | ErrorData:
        callback = self.elicitation_callback
        assert callback is not None  # the session gets this answerer only with a callback
        return await self._answer("elicitation", callback(context, params))

    async def _answer(self, what: str, answer: Awaitable[_A]) -> _A | ErrorData:
        """A callback's answer, or an error answer if it fails or takes too long: a server
        waiting on it must never hang."""
        try:
            with anyio.fail_after(self.callback_timeout):
                return await answer
        except Exception as exc:
            logger.warning("MCP %s callback failed: %s", what, _describe(exc))
            return ErrorData(
                code=INTERNAL_ERROR,
                message=f"the client's {what} callback failed: {_describe(exc)}",
            )

    def _check_open(self) -> None:
        if self._state != "open":
            hint = (
                "open it with `async with manager:` (for tools from a config: "
                "`async with toolrollout.tools.open_tools(tools):`, or "
                "`toolrollout.tools.mcp.mcp_sessions(tools)`) around the calls"
                if self._state == "new"
                else "it is closed"
            )
            raise UserError(f"{self!r} is not open: {hint}")

    def _spawn(self, func: Any, session: _Session, name: str) -> None:
        assert self._task_group is not None
        self._task_group.start_soon(func, session, name=name)

    def _server(self, name: str) -> _Server:
        try:
            return self._servers[name]
        except KeyError:
            raise UserError(
                f"unknown MCP server {name!r}; known: {', '.join(sorted(self._servers))}"
            ) from None

    async def connect(self, *servers: str) -> None:
        """Connect now (default: every server) instead of on first use; fail fast.

        Raises :class:`~toolrollout.exceptions.ToolUnavailable` for the first server that cannot be
        reached.
        """
        names = servers or tuple(self._servers)
        for name in names:
            self._server(name)  # unknown names fail before anything starts

        async def connect_one(name: str) -> None:
            await self._servers[name].acquire()

        await _each(names, connect_one)

    async def list_tools(self, server: str) -> list[McpToolInfo]:
        """The tools the server listed when its current session was opened."""
        session = await self._server(server).acquire()
        return list(session.tools)

    async def call_tool(
        self,
        server: str,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        meta: Mapping[str, Any] | None = None,
    ) -> CallToolResult:
        """Call a tool on the server's shared session and return the raw MCP result.

        An ``isError`` result is returned, not raised. Raises, from the library's tree:
        :class:`~toolrollout.exceptions.ToolUnavailable` (cannot connect, session lost, rate
        limited), :class:`~toolrollout.exceptions.ToolArgumentError` (the server rejected the
        arguments), :class:`~toolrollout.exceptions.ToolTimeout` (a server-side timeout),
        :class:`~toolrollout.exceptions.ToolExecutionError` (other protocol errors, malformed
        results), :class:`~toolrollout.UserError` (the manager is not open). Cancelling
        the caller cancels the request on the server.
        """
        return await self._server(server).call(name, arguments or {}, meta)

    async def listings(self) -> dict[str, Sequence[McpToolInfo]]:
        """Connect to every server and list its tools, by server name in config order.

        :func:`toolrollout.tools.mcp.list_mcp_tools` wraps these as tools; the manager
        itself knows nothing of the tool class, so the two modules import one way only.
        """
        listings: dict[str, Sequence[McpToolInfo]] = {}

        async def fetch(name: str) -> None:
            listings[name] = await self.list_tools(name)

        await _each(self._servers, fetch)
        return {name: listings[name] for name in self._servers}

    def statistics(self) -> Mapping[str, McpServerStatistics]:
        """A snapshot of every server's counters, by server name."""
        return MappingProxyType({name: s.snapshot() for name, s in self._servers.items()})
