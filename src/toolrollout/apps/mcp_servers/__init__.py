"""The project's own example MCP servers, built on the MCP SDK's v2 ``MCPServer``.

Each one runs as ``python -m toolrollout.apps.mcp_servers.<name>`` with
``--transport stdio|streamable-http|sse`` (default ``stdio``), ``--host`` and ``--port``:

- :mod:`~toolrollout.apps.mcp_servers.calculator`: the demo task's safe calculator as an MCP tool.
- :mod:`~toolrollout.apps.mcp_servers.video_tools`: LongVT-style ``crop_video`` (frames of a time
  window as PNG images, bounded count) and ``crop_image`` (zoom), decoded with PyAV.
- :mod:`~toolrollout.apps.mcp_servers.testkit`: tools that misbehave on purpose (hang, crash the
  server, return images, errors, odd content, rate-limit), for testing MCP clients.

Streamable HTTP is served at ``http://HOST:PORT/mcp``, SSE at ``http://HOST:PORT/sse``.
"""

from __future__ import annotations

from ._cli import serve as serve

__all__ = ["serve"]
