"""MCP servers as tools, over the official ``mcp`` SDK (version 2).

- :func:`load_mcp_servers` reads an ``mcpServers`` JSON file into :class:`StdioServer` /
  :class:`HttpServer` specs.
- :class:`McpClientManager` keeps one persistent session per server, shared by every
  trajectory; it is opened with ``async with`` and connects each server lazily, on first
  call, reconnecting after a lost session.
- :class:`McpTool` is one server tool as a :class:`~toolrollout.tools.Tool`;
  ``load_tool_config`` builds them from ``config.type: mcp`` entries (the ``mcp`` tool
  type's builder is :func:`build_mcp_entry`). Each tool's :meth:`~McpTool.services` is its
  manager (:class:`McpSessionService`), so :func:`toolrollout.tools.open_tools` opens each
  manager once; :func:`mcp_sessions` does the same for MCP tools alone.

See ``docs/mcp.md``.
"""

from __future__ import annotations

from ._config import VERL_MCP_CLASSES as VERL_MCP_CLASSES
from ._config import McpSettingsModel as McpSettingsModel
from ._config import build_mcp_entry as build_mcp_entry
from ._config import discover_tools as discover_tools
from ._manager import ElicitationCallback as ElicitationCallback
from ._manager import McpClientManager as McpClientManager
from ._manager import McpRoot as McpRoot
from ._manager import McpServerStatistics as McpServerStatistics
from ._manager import SamplingCallback as SamplingCallback
from ._results import decode_image as decode_image
from ._results import mcp_result_to_tool_result as mcp_result_to_tool_result
from ._servers import HttpServer as HttpServer
from ._servers import McpServerSpec as McpServerSpec
from ._servers import StdioServer as StdioServer
from ._servers import load_mcp_servers as load_mcp_servers
from ._servers import parse_mcp_servers as parse_mcp_servers
from ._tool import McpSessionService as McpSessionService
from ._tool import McpTool as McpTool
from ._tool import build_mcp_tools as build_mcp_tools
from ._tool import list_mcp_tools as list_mcp_tools
from ._tool import mcp_managers as mcp_managers
from ._tool import mcp_sessions as mcp_sessions
from ._tool import requires_tasks as requires_tasks

__all__ = [
    "VERL_MCP_CLASSES",
    "ElicitationCallback",
    "HttpServer",
    "McpClientManager",
    "McpRoot",
    "McpServerSpec",
    "McpServerStatistics",
    "McpSessionService",
    "McpSettingsModel",
    "McpTool",
    "SamplingCallback",
    "StdioServer",
    "build_mcp_entry",
    "build_mcp_tools",
    "decode_image",
    "discover_tools",
    "list_mcp_tools",
    "load_mcp_servers",
    "mcp_managers",
    "mcp_result_to_tool_result",
    "mcp_sessions",
    "parse_mcp_servers",
    "requires_tasks",
]
