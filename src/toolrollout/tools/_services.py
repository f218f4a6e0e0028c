"""Open what a set of tools needs while a run uses them, once each, and close it after.

Every tool declares its needs with :meth:`~toolrollout.tools.Tool.services`: MCP tools
their manager's sessions, a sandbox tool with ``local_sandbox: true`` the local sandbox, a
search tool with ``local_corpus`` the local retriever. :func:`open_tools` opens each
distinct service once, in order, and closes them in reverse order on exit, also when the
body fails or is cancelled, so a run never leaves a session or child process behind.
:func:`share_tools` lets overlapping users of the same services (calls on a runner, or
several runners built on one tool set, as verl's agent loop does per sample) share one
opening.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Hashable, Iterable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field

import anyio

from toolrollout._exceptions import UserError

from ._base import Tool, ToolService
from ._executor import ToolExecutor

__all__ = ["open_tools", "share_tools"]


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


@dataclass(eq=False)
class _Opening:
    """One shared opening of a set of services: who uses it, and when it may close."""

    users: int = 1
    idle: anyio.Event = field(default_factory=anyio.Event)
    closed: anyio.Event = field(default_factory=anyio.Event)


_openings: dict[frozenset[Hashable], _Opening] = {}
"""The shared openings in progress, by the keys of their services."""


@asynccontextmanager
async def share_tools(tools: Iterable[Tool] | ToolExecutor) -> AsyncIterator[None]:
    """Like :func:`open_tools`, but users that overlap share one opening.

    The first user opens the services; users that start while it is open (with the same
    services) join it. Services must close in the task that opened them, so the first
    user's block ends only once everyone who joined has left. A trainer that sends one
    batch at a time (ms-swift, verl) never notices; the services stay open for the batch
    instead of being opened per sample.
    """
    services = _services_of(tools)
    if not services:
        yield
        return
    key = frozenset(service.key for service in services)
    while (opening := _openings.get(key)) is not None and opening.users == 0:
        await opening.closed.wait()  # the last opening is closing: open anew after it
    if opening is not None:  # open already: join it
        opening.users += 1
        try:
            yield
        finally:
            opening.users -= 1
            if not opening.users:
                opening.idle.set()
        return
    opening = _openings[key] = _Opening()
    try:
        async with open_tools(tools):
            try:
                yield
            finally:
                opening.users -= 1
                while opening.users:  # others joined: close after the last one leaves
                    opening.idle = anyio.Event()
                    await opening.idle.wait()
    finally:
        del _openings[key]
        opening.users = 0
        opening.closed.set()
