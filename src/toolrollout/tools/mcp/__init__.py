"""MCP servers as tools, over the official ``mcp`` SDK (version 2): ``mcpServers`` files
(:func:`load_mcp_servers`), one persistent session per server (:class:`McpClientManager`)
and each server tool as a :class:`McpTool`. See ``docs/mcp.md``.
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
