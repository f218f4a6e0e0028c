"""Open what a set of tools needs while a run uses them, once each, and close it after.

Every tool declares its needs with :meth:`~toolrollout.tools.Tool.services`: MCP tools
their manager's sessions, a sandbox tool with ``local_sandbox: true`` the local sandbox, a
search tool with ``local_corpus`` the local retriever. :func:`open_tools` opens each
distinct service once, in order, and closes them in reverse order on exit, also when the
body fails or is cancelled, so a run never leaves a session or child process behind.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Hashable, Iterable
from contextlib import AsyncExitStack, asynccontextmanager

from toolrollout._exceptions import UserError

from ._base import Tool, ToolService
from ._executor import ToolExecutor

__all__ = ["open_tools"]


def _services_of(tools: Iterable[Tool] | ToolExecutor) -> list[ToolService]:
    """The distinct services ``tools`` need, in first-seen order.

    Raises :class:`~toolrollout.UserError` when two tools need different services under
    one key (e.g. two corpora on one retriever port).
    """
    tool_list = list(tools.tools.values() if isinstance(tools, ToolExecutor) else tools)
    found: dict[Hashable, tuple[ToolService, Tool]] = {}
    for tool in tool_list:
        for service in tool.services():
            first = found.setdefault(service.key, (service, tool))
            if first[0] != service:
                raise UserError(
                    f"tools {first[1].name!r} and {tool.name!r} need different services "
                    f"under one key {service.key!r}: {first[0]!r} and {service!r}"
                )
    return [service for service, _ in found.values()]


@asynccontextmanager
async def open_tools(tools: Iterable[Tool] | ToolExecutor) -> AsyncIterator[list[Tool]]:
    """Open the services ``tools`` need for the ``async with`` body; yield the tools.

    ::

        async with open_tools(load_tool_config("tool_configs/sandbox.yaml")) as tools:
            executor = ToolExecutor(tools)
            ...

    Services are opened one after the other (each in this task, as anyio's structured
    concurrency wants) and closed in reverse order. Tools without services cost nothing.
    """
    tool_list = list(tools.tools.values() if isinstance(tools, ToolExecutor) else tools)
    services = _services_of(tool_list)
    async with AsyncExitStack() as stack:
        for service in services:
            await stack.enter_async_context(service.open())
        yield tool_list
