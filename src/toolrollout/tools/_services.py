"""Open what a set of tools needs (their :meth:`~toolrollout.tools.Tool.services`) while a
run uses them, once each, and close it after, so a run never leaves a session or child
process behind; :func:`share_tools` lets overlapping users share one opening.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Hashable, Iterable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import TypeVar

import anyio

from toolrollout._exceptions import UserError

from ._base import Tool, ToolService
from ._executor import ToolExecutor

__all__ = ["open_each", "open_tools", "services_of", "share_tools"]

T = TypeVar("T")


def services_of(tools: Iterable[Tool] | ToolExecutor) -> list[ToolService]:
    """The distinct services ``tools`` need, in first-seen order (different services under
    one key are a UserError)."""
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


async def open_each(
    stack: AsyncExitStack, openings: Iterable[AbstractAsyncContextManager[T | None]]
) -> list[T]:
    """Enter each opening on ``stack``, in order; what they yield, less the Nones."""
    started: list[T] = []
    for opening in openings:
        value = await stack.enter_async_context(opening)
        if value is not None:
            started.append(value)
    return started


@asynccontextmanager
async def open_tools(tools: Iterable[Tool] | ToolExecutor) -> AsyncIterator[list[Tool]]:
    """Open the services ``tools`` need for the ``async with`` body, one after the other in
    this task, and close them in reverse order; yield the tools."""
    tool_list = list(tools.tools.values() if isinstance(tools, ToolExecutor) else tools)
    services = services_of(tool_list)
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
    """Like :func:`open_tools`, but users that overlap share one opening: the first opens
    the services and, as they close in its task, leaves only after everyone who joined."""
    services = services_of(tools)
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
