"""``config.type: mcp`` entries of a verl-layout tool config: the servers' tools, listed
over short-lived sessions, as :class:`McpTool` objects of one new, unopened manager."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from typing import Any, Literal, Self

import anyio
from mcp.types import Tool as McpToolInfo
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    ValidationError,
    field_validator,
    model_validator,
)

from toolrollout._exceptions import ConfigError, ToolRolloutError, UserError

from .._base import Tool
from .._config import _validation_error, import_entry, with_entry_limits
from .._models import ToolEntryModel
from .._registry import BuildContext
from ._connection import describe
from ._launch import LocalMcpHttpService
from ._manager import McpClientManager, McpRoot, _each
from ._servers import HttpServer, McpServerSpec, load_mcp_servers
from ._tool import McpTool, build_mcp_tools

__all__ = ["VERL_MCP_CLASSES", "McpSettingsModel", "build_mcp_entry", "discover_tools"]

VERL_MCP_CLASSES = (
    "verl.tools.mcp_base_tool.MCPBaseTool",
    "verl.tools.mcp_search_tool.MCPSearchTool",
)
"""verl (<= 0.7.1) MCP tool classes; an entry naming one loads as :class:`McpTool`."""


class _RootModel(BaseModel):
    """One root: a ``path`` (a plain string in the YAML) or a ``uri``, and a name."""

    model_config = ConfigDict(extra="forbid")

    path: str | None = Field(default=None, min_length=1)
    uri: str | None = Field(default=None, min_length=1)
    name: str | None = None

    @model_validator(mode="after")
    def _one_of(self) -> Self:
        if (self.path is None) == (self.uri is None):
            raise ValueError("give either 'path' or 'uri'")
        return self


class McpSettingsModel(BaseModel):
    """An entry's ``mcp`` mapping (verl's keys plus ours)."""

    model_config = ConfigDict(extra="forbid")

    mcp_servers_config_path: str = Field(min_length=1)
    """The ``mcpServers`` JSON file, relative to the YAML file's folder or absolute."""
    tool_selected_list: list[str] | None = None
    """Allow-list of tool names as the servers spell them (default: every tool)."""
    tool_name_prefix: str = ""
    """Put before each name shown to the model; ``{server}`` is replaced by the server."""
    schema_key_order: Literal["canonical", "as_sent"] = "canonical"
    """Input schemas as a native tool's (``type``, ``properties``, ``required`` first) or as
    the server sent them."""
    connect_timeout: PositiveFloat = 30.0
    """Seconds to start/connect a server, initialize and list its tools."""
    progress_idle_timeout: PositiveFloat | None = None
    """Fail a call whose server sent no progress notification for this many seconds
    (default: off); the entry's ``config.timeout`` still bounds every call."""
    heartbeat_interval: PositiveFloat | None = 10.0
    """Seconds between pings of an HTTP session while calls are in flight (null: never)."""
    roots: list[_RootModel] = []
    """Roots offered to servers (``roots/list``): paths (relative to the YAML file's folder)
    or ``{uri, name}`` mappings."""
    sampling_callback: str | None = None
    """``module:function`` answering ``sampling/createMessage`` (none: not declared)."""
    elicitation_callback: str | None = None
    """``module:function`` answering ``elicitation/create`` (none: not declared)."""
    callback_timeout: PositiveFloat = 60.0
    """Seconds a sampling or elicitation callback may take before the request is refused."""

    @field_validator("roots", mode="before")
    @classmethod
    def _paths(cls, value: object) -> object:
        if isinstance(value, list):
            return [{"path": item} if isinstance(item, str) else item for item in value]
        return value


def discover_tools(
    servers: Mapping[str, McpServerSpec],
    *,
    connect_timeout: float = 30.0,
    manager_options: Mapping[str, Any] | None = None,
) -> dict[str, list[McpToolInfo]]:
    """List every server's tools over a short-lived session each, blocking, in an event
    loop of its own on a worker thread (so it works inside a running loop too).
    ``manager_options`` are the real sessions' roots and callbacks: some servers list tools
    by capability."""

    async def run() -> dict[str, list[McpToolInfo]]:
        manager = McpClientManager(
            servers, connect_timeout=connect_timeout, **dict(manager_options or {})
        )
        listings: dict[str, list[McpToolInfo]] = {}

        async def fetch(name: str) -> None:
            listings[name] = await manager.list_tools(name)

        async with AsyncExitStack() as stack:
            for spec in servers.values():  # the HTTP servers the run starts: up for the listing
                if isinstance(spec, HttpServer) and spec.command is not None:
                    await stack.enter_async_context(
                        LocalMcpHttpService(spec, startup_timeout=connect_timeout).open()
                    )
            await stack.enter_async_context(manager)
            await _each(servers, fetch)
        return {name: listings[name] for name in servers}

    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mcp-discovery") as pool:
        return pool.submit(anyio.run, run).result()


def _callback(name: str | None, key: str, where: Callable[[str], str]) -> Any:
    if name is None:
        return None
    _, obj = import_entry(name.strip(), where(key))
    if not callable(obj):
        raise ConfigError(
            f"{where(key)}: {name!r} is not callable; expected async (context, params) -> result"
        )
    return obj


def _roots(settings: McpSettingsModel, context: BuildContext) -> list[McpRoot]:
    roots = []
    for item in settings.roots:
        if item.path is not None:
            path = context.resolve(item.path).resolve()
            roots.append(McpRoot(uri=path.as_uri(), name=item.name or path.name or str(path)))
        else:
            assert item.uri is not None
            roots.append(McpRoot(uri=item.uri, name=item.name))
    return roots


def _tool_class(class_name: str, where: Callable[[str], str]) -> type[McpTool]:
    name = class_name.strip()
    if name in VERL_MCP_CLASSES or name in (
        "toolrollout.tools.mcp.McpTool",
        "toolrollout.tools.mcp:McpTool",
    ):
        return McpTool
    _, obj = import_entry(name, where("class_name"))
    if not (isinstance(obj, type) and issubclass(obj, McpTool)):
        raise ConfigError(
            f"{where('class_name')}: {name!r} is not an McpTool subclass; entries of "
            "config.type 'mcp' take toolrollout.tools.mcp.McpTool (or a verl MCP class)"
        )
    return obj


def _settings(entry: ToolEntryModel, context: BuildContext) -> McpSettingsModel:
    """The entry's validated ``mcp`` block; refuse what a ``type: mcp`` entry cannot hold."""
    where = context.where
    if entry.mcp is None:
        raise ConfigError(
            f"{where('mcp')}: is required for config.type 'mcp' "
            "(mcp_servers_config_path, optional tool_selected_list)"
        )
    try:
        settings = McpSettingsModel.model_validate(entry.mcp)
    except ValidationError as exc:
        raise _validation_error(context.source, exc, f"tools[{context.index}].mcp.") from exc
    if entry.tool_schema is not None:
        raise ConfigError(
            f"{where('tool_schema')}: not supported for config.type 'mcp': the servers' "
            "tool lists supply the schemas (use mcp.tool_selected_list to choose tools)"
        )
    unknown = sorted((entry.config.model_extra or {}).keys())
    if unknown:
        raise ConfigError(
            "\n".join(
                f"{where('config.' + key)}: unknown key for config.type 'mcp'" for key in unknown
            )
        )
    return settings


def build_mcp_entry(entry: ToolEntryModel, context: BuildContext) -> list[Tool]:
    """Build the tools of one ``type: mcp`` entry (the builder of the ``mcp`` tool type)."""
    where = context.where
    settings = _settings(entry, context)
    tool_class = _tool_class(entry.class_name, where)

    path = context.resolve(settings.mcp_servers_config_path)
    try:
        servers = load_mcp_servers(path)
    except ConfigError as exc:
        raise ConfigError(f"{where('mcp.mcp_servers_config_path')}: {exc}") from exc

    options: dict[str, Any] = {
        "roots": _roots(settings, context),
        "sampling_callback": _callback(settings.sampling_callback, "mcp.sampling_callback", where),
        "elicitation_callback": _callback(
            settings.elicitation_callback, "mcp.elicitation_callback", where
        ),
        "callback_timeout": settings.callback_timeout,
        "progress_idle_timeout": settings.progress_idle_timeout,
        "heartbeat_interval": settings.heartbeat_interval,
    }
    manager = McpClientManager(
        servers, connect_timeout=settings.connect_timeout, source=str(path), **options
    )
    try:
        listings: Mapping[str, Sequence[McpToolInfo]] = discover_tools(
            servers, connect_timeout=settings.connect_timeout, manager_options=options
        )
    except UserError:
        raise
    except Exception as exc:
        raise ConfigError(
            f"{where('mcp')}: cannot list the tools of the servers in {path}: "
            + (str(exc) if isinstance(exc, ToolRolloutError) else describe(exc))
        ) from exc
    if settings.tool_selected_list is not None:
        available = {info.name for infos in listings.values() for info in infos}
        missing = [name for name in settings.tool_selected_list if name not in available]
        if missing:
            raise ConfigError(
                f"{where('mcp.tool_selected_list')}: no server in {path} lists the tool(s) "
                f"{', '.join(map(repr, missing))}; available: "
                f"{', '.join(sorted(available)) or 'none'}"
            )
    try:
        tools = build_mcp_tools(
            manager,
            listings,
            selected=settings.tool_selected_list,
            name_prefix=settings.tool_name_prefix,
            tool_class=tool_class,
            schema_key_order=settings.schema_key_order,
        )
    except UserError as exc:
        raise ConfigError(f"{where('mcp')}: {exc}") from exc
    return with_entry_limits(entry, list(tools), where("config"))
