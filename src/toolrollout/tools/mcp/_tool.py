"""MCP tools as :class:`~toolrollout.tools.Tool` objects, and opening their sessions."""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Hashable, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, best_match
from jsonschema.validators import validator_for
from mcp.types import CallToolResult
from mcp.types import Tool as McpToolInfo

from toolrollout._exceptions import ToolArgumentError, UserError

from .._base import Tool, ToolService
from .._types import ToolContext, ToolLimits, ToolResult
from ._launch import LocalMcpHttpService
from ._manager import McpClientManager
from ._results import mcp_result_to_tool_result
from ._servers import HttpServer

__all__ = [
    "McpSessionService",
    "McpTool",
    "build_mcp_tools",
    "list_mcp_tools",
    "mcp_managers",
    "mcp_sessions",
    "requires_tasks",
]

logger = logging.getLogger(__name__)

_INVALID_NAME_CHARS = re.compile(r"[^A-Za-z0-9_-]")
_TASKS_UNSUPPORTED = (
    "it requires MCP task augmentation (execution.taskSupport: required), which this "
    "client cannot use: the mcp SDK validates a tools/call answer as a CallToolResult, "
    "so a task handle (CreateTaskResult) cannot be received"
)
_UNSET = object()


@dataclass(frozen=True, slots=True)
class McpSessionService:
    """The :class:`~toolrollout.tools.ToolService` of MCP tools: their manager, opened (one
    open already is used and left open)."""

    manager: McpClientManager

    @property
    def key(self) -> Hashable:
        return ("toolrollout.tools.mcp", id(self.manager))

    @asynccontextmanager
    async def open(self) -> AsyncIterator[McpClientManager]:
        if self.manager.is_open:
            yield self.manager
            return
        async with self.manager:
            yield self.manager


@dataclass(frozen=True, kw_only=True)
class McpTool(Tool):
    """One tool of an MCP server, called through its manager's shared session; subclasses
    (named as ``class_name`` of a ``type: mcp`` entry) may override :meth:`convert_result`."""

    manager: McpClientManager = field(compare=False, repr=False)
    """Owns the session the calls go through; must be open while calls run."""
    server: str
    """Name of the server (its key in ``mcpServers``)."""
    remote_name: str
    """The tool's name on the server (``name`` is what the model sees)."""
    title: str | None = None
    """The server's display title of the tool, if any."""
    annotations: Mapping[str, Any] | None = None
    """The server's tool annotations (``readOnlyHint``...), as listed, camelCase keys."""
    output_schema: Mapping[str, Any] | None = None
    """JSON schema of the tool's ``structuredContent`` (its ``outputSchema``), if listed."""

    def services(self) -> Sequence[ToolService]:
        """The manager's sessions, after the tool's server when the run starts it."""
        spec = self.manager.servers.get(self.server)
        if isinstance(spec, HttpServer) and spec.command is not None:
            return (LocalMcpHttpService(spec), McpSessionService(self.manager))
        return (McpSessionService(self.manager),)

    def check_arguments(self, arguments: Mapping[str, Any]) -> None:
        """Check the arguments against the server's input schema (when it is a valid one):
        a mismatch is the model's fault, not an ``isError`` answer."""
        super().check_arguments(arguments)
        validator = self._schema_validator()
        if validator is None:
            return
        error = best_match(validator.iter_errors(dict(arguments)))
        if error is not None:
            place = "/".join(str(part) for part in error.absolute_path) or "arguments"
            raise ToolArgumentError(
                f"invalid arguments for tool {self.name!r}: {place}: {error.message}"
            )

    def _schema_validator(self) -> Any:
        cached = self.__dict__.get("_validator", _UNSET)
        if cached is _UNSET:
            schema = dict(self.parameters)
            cls = validator_for(schema, default=Draft202012Validator)
            try:
                cls.check_schema(schema)
                cached = cls(schema)
            except SchemaError:
                cached = None
            object.__setattr__(self, "_validator", cached)  # a cache on a frozen dataclass
        return cached

    async def call(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        result = await self.manager.call_tool(self.server, self.remote_name, arguments)
        return self.convert_result(result)

    def convert_result(self, result: CallToolResult) -> ToolResult:
        """Turn the MCP result into what the model sees (see :mod:`._results`)."""
        return mcp_result_to_tool_result(result, tool_name=self.name)


def _model_name(prefix: str, server: str, remote: str) -> str:
    name = _INVALID_NAME_CHARS.sub("_", prefix.replace("{server}", server) + remote)
    return name[:64]


def requires_tasks(info: McpToolInfo) -> bool:
    """Whether the tool may only be called as an MCP task (``taskSupport: required``)."""
    execution = info.execution
    return execution is not None and execution.task_support == "required"


SchemaKeyOrder = Literal["canonical", "as_sent"]
"""How an MCP tool's input schema is ordered in the prompt (see :func:`_parameters`)."""


def _parameters(info: McpToolInfo, order: SchemaKeyOrder = "canonical") -> dict[str, Any]:
    """The tool's input schema, by default with ``type``, ``properties``, ``required`` first
    (the SDK sends them after, and the chat template renders the order it gets), so the
    prompt is a native tool's; ``"as_sent"`` keeps the server's order."""
    schema = dict(info.input_schema or {})
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})
    if order == "as_sent":
        return schema
    head: dict[str, Any] = {
        key: schema.pop(key) for key in ("type", "properties", "required") if key in schema
    }
    return {**head, **schema}


def build_mcp_tools(
    manager: McpClientManager,
    listings: Mapping[str, Sequence[McpToolInfo]],
    *,
    selected: Iterable[str] | None = None,
    name_prefix: str = "",
    limits: ToolLimits | None = None,
    tool_class: type[McpTool] = McpTool,
    schema_key_order: SchemaKeyOrder = "canonical",
) -> list[McpTool]:
    """Wrap listed tools (``{server: [tool, ...]}``) as ``tool_class`` objects.

    ``selected`` keeps only those (server-side) names; an unknown one, two tools with one
    model-facing name, or a selected tool that requires MCP tasks is a UserError (an
    unselected one is left out with a warning).
    """
    wanted = None if selected is None else list(dict.fromkeys(selected))
    found: set[str] = set()
    tools: list[McpTool] = []
    owners: dict[str, str] = {}
    for server, infos in listings.items():
        for info in infos:
            if wanted is not None and info.name not in wanted:
                continue
            found.add(info.name)
            if requires_tasks(info):
                if wanted is not None:
                    raise UserError(
                        f"MCP tool {info.name!r} of server {server!r}: {_TASKS_UNSUPPORTED}"
                    )
                logger.warning(
                    "MCP tool %r of server %r left out of the tool list: %s",
                    info.name,
                    server,
                    _TASKS_UNSUPPORTED,
                )
                continue
            name = _model_name(name_prefix, server, info.name)
            if name in owners:
                raise UserError(
                    f"two MCP tools would both be named {name!r} (servers {owners[name]!r} "
                    f"and {server!r}); set a tool_name_prefix such as '{{server}}_'"
                )
            owners[name] = server
            description = info.description or info.title or ""
            tool = tool_class(
                name=name,
                description=description,
                parameters=_parameters(info, schema_key_order),
                manager=manager,
                server=server,
                remote_name=info.name,
                title=info.title,
                annotations=None
                if info.annotations is None
                else info.annotations.model_dump(by_alias=True, exclude_none=True),
                output_schema=None if info.output_schema is None else dict(info.output_schema),
            )
            tools.append(tool if limits is None else tool.with_limits(limits))
    if wanted is not None:
        missing = [name for name in wanted if name not in found]
        if missing:
            available = sorted({info.name for infos in listings.values() for info in infos})
            raise UserError(
                f"no MCP server lists the tool(s) {', '.join(map(repr, missing))}; "
                f"available: {', '.join(available) or 'none'}"
            )
    return tools


async def list_mcp_tools(
    manager: McpClientManager,
    *,
    selected: Iterable[str] | None = None,
    name_prefix: str = "",
    limits: ToolLimits | None = None,
) -> list[McpTool]:
    """Connect to every server of ``manager`` and wrap its tools as :class:`McpTool` objects
    (``{server}`` in ``name_prefix`` is the server's name)."""
    listings = await manager.listings()
    return build_mcp_tools(
        manager, listings, selected=selected, name_prefix=name_prefix, limits=limits
    )


def mcp_managers(tools: Iterable[Tool]) -> list[McpClientManager]:
    """The distinct managers behind the MCP tools among ``tools``, in first-seen order."""
    managers: dict[int, McpClientManager] = {}
    for tool in tools:
        if isinstance(tool, McpTool):
            managers.setdefault(id(tool.manager), tool.manager)
    return list(managers.values())


@asynccontextmanager
async def mcp_sessions(tools: Iterable[Tool]) -> AsyncIterator[list[McpClientManager]]:
    """Open the managers of the MCP tools among ``tools`` for the ``async with`` body and
    yield them (:func:`toolrollout.tools.open_tools` also opens the other tools' services)."""
    tools = list(tools)
    managers = mcp_managers(tools)
    launched: dict[Hashable, ToolService] = {}
    for tool in tools:
        if isinstance(tool, McpTool):
            for service in tool.services()[:-1]:  # the servers the run starts, if any
                launched.setdefault(service.key, service)
    async with AsyncExitStack() as stack:
        for service in launched.values():
            await stack.enter_async_context(service.open())
        for manager in managers:
            await stack.enter_async_context(McpSessionService(manager).open())
        yield managers
