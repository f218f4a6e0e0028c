"""The project's own example MCP servers, built on the MCP SDK's v2 ``MCPServer``.

Each one runs as ``python -m toolrollout.apps.mcp_servers.<name>`` with
``--transport stdio|streamable-http|sse`` (default ``stdio``), ``--host`` and ``--port``:
``calculator``, ``video_tools`` and ``testkit`` (see docs/mcp.md, "The project's own servers").
"""

from __future__ import annotations

from ._cli import serve as serve

__all__ = ["serve"]
