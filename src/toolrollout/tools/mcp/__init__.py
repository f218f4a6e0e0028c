"""MCP servers as tools, over the official ``mcp`` SDK (version 2).

- :func:`load_mcp_servers` reads an ``mcpServers`` JSON file into :class:`StdioServer` /
  :class:`HttpServer` specs.
- :class:`McpClientManager` keeps one persistent session per server, shared by every
  trajectory; it is opened with ``async with`` and connects each server lazily, on first
  call, reconnecting after a lost session.
- :class:`McpTool` is one server tool as a :class:`~toolrollout.tools.Tool`;
  ``load_tool_config`` builds them from ``config.type: mcp`` entries. Each tool's
  :meth:`~McpTool.services` is its manager (an ``McpSessionService``), so
  :func:`toolrollout.tools.open_tools` opens each manager once; :func:`mcp_sessions` does
  the same for MCP tools alone.

See ``docs/mcp.md``.
"""

from __future__ import annotations

from ._manager import McpClientManager as McpClientManager
from ._manager import McpRoot as McpRoot
from ._servers import load_mcp_servers as load_mcp_servers
from ._tool import McpTool as McpTool
from ._tool import list_mcp_tools as list_mcp_tools
from ._tool import mcp_sessions as mcp_sessions

__all__ = [
    "McpClientManager",
    "McpRoot",
    "McpTool",
    "list_mcp_tools",
    "load_mcp_servers",
    "mcp_sessions",
]
