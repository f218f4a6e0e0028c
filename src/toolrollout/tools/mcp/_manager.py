"""One persistent MCP session per server, shared by every trajectory, reconnected on loss.

Each server's session lives in a background task of the manager's task group, started by
the first call and replaced by the next one once found dead. Calls run in the callers' own
tasks, so cancelling a caller cancels its request on the server. A capability (roots,
sampling, elicitation) is declared only when configured, so servers offer only tools that
can work.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal, Self, TypeVar

import anyio
import anyio.abc
from mcp.client.session import ClientRequestContext, ElicitationFnT, SamplingFnT
from mcp.types import (
    INTERNAL_ERROR,
    CallToolResult,
    CreateMessageRequestParams,
    CreateMessageResult,
    CreateMessageResultWithTools,
    ElicitRequestParams,
    ElicitResult,
    ErrorData,
    ListRootsResult,
    Root,
)
from mcp.types import Tool as McpToolInfo

from toolrollout._exceptions import (
    UserError,
)

from ._connection import McpServerStatistics, ServerConnection, describe
from ._servers import McpServerSpec
from ._session import Session

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


@dataclass(frozen=True, slots=True)
class McpRoot:
    """A root the client offers servers (``roots/list``): a ``file://`` URI and a name."""

    uri: str
    name: str | None = None


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


class McpClientManager:
    """Owns one persistent session per MCP server, shared by all calls and trajectories.

    Open it with ``async with manager:`` (sessions connect on first use); closing closes
    every session and stops every child process. The call that finds a session lost fails
    as ToolUnavailable (retried by the executor); the next one reconnects. One event loop.
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
        """``source`` names where the servers came from, for messages. ``roots`` and the
        callbacks answer the servers' requests (a callback within ``callback_timeout``).
        ``progress_idle_timeout`` fails a call that gets no progress for that long (None:
        off); ``heartbeat_interval`` is how often an HTTP session with calls in flight is
        pinged (None: never)."""
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
        self._servers: dict[str, ServerConnection] = {}
        for spec in specs:
            if spec.name in self._servers:
                raise UserError(f"two MCP servers are named {spec.name!r}")
            self._servers[spec.name] = ServerConnection(spec, self)
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
        """Open the manager's task group; ``aclose()`` must be awaited in the same task."""
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
        """Close every session and stop every child process (idempotent)."""
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

    async def __aexit__(self, *exc_info: object) -> None:
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
            logger.warning("MCP %s callback failed: %s", what, describe(exc))
            return ErrorData(
                code=INTERNAL_ERROR,
                message=f"the client's {what} callback failed: {describe(exc)}",
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

    def _spawn(self, func: Any, session: Session, name: str) -> None:
        assert self._task_group is not None
        self._task_group.start_soon(func, session, name=name)

    def _server(self, name: str) -> ServerConnection:
        try:
            return self._servers[name]
        except KeyError:
            raise UserError(
                f"unknown MCP server {name!r}; known: {', '.join(sorted(self._servers))}"
            ) from None

    async def connect(self, *servers: str) -> None:
        """Connect now (default: every server) instead of on first use; fail fast."""
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
        """Call a tool on the server's shared session; the raw MCP result (``isError``
        included). Failures raise from the library's tree (see ``ServerConnection``)."""
        return await self._server(server).call(name, arguments or {}, meta)

    async def listings(self) -> dict[str, Sequence[McpToolInfo]]:
        """Connect to every server and list its tools, by server name in config order."""
        listings: dict[str, Sequence[McpToolInfo]] = {}

        async def fetch(name: str) -> None:
            listings[name] = await self.list_tools(name)

        await _each(self._servers, fetch)
        return {name: listings[name] for name in self._servers}

    def statistics(self) -> Mapping[str, McpServerStatistics]:
        """A snapshot of every server's counters, by server name."""
        return MappingProxyType({name: s.snapshot() for name, s in self._servers.items()})
