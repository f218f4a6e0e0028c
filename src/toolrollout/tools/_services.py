"""Start and stop what a set of tools needs while a run uses them.

Some tools talk to services toolrollout can run itself: the local BM25 retriever for a
search tool configured with ``local_corpus``, the bubblewrap sandbox for a sandbox tool
with ``local_sandbox: true``. :func:`tool_services` starts those (unless something already
listens on their port) and closes every session and child process on exit, so a run never
leaves orphans behind. MCP tools get their shared sessions opened here too (the MCP SDK is
only imported when a config loaded MCP tools).
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterable
from contextlib import AsyncExitStack, asynccontextmanager

from ._base import Tool

__all__ = ["tool_services"]


@asynccontextmanager
async def tool_services(tools: Iterable[Tool]) -> AsyncIterator[None]:
    """Run the local services ``tools`` ask for, for the duration of the block."""
    from toolrollout.sandbox import serve_local_sandboxes
    from toolrollout.search import serve_local_retrievers

    tool_list = list(tools)
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(serve_local_retrievers(tool_list))
        await stack.enter_async_context(serve_local_sandboxes(tool_list))
        mcp = sys.modules.get("toolrollout.tools.mcp")
        if mcp is not None:
            await stack.enter_async_context(mcp.mcp_sessions(tool_list))
        yield
