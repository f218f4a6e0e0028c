"""One session with an MCP server: its transport, and the SDK's ``ClientSession`` on it."""

from __future__ import annotations

import math
import os
import sys
from contextlib import AsyncExitStack
from typing import Any, Self, TextIO

import anyio
import httpx2
from mcp import ClientSession, StdioServerParameters
from mcp.client.sse import sse_client
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.message import SessionMessage
from mcp.types import PaginatedRequestParams
from mcp.types import Tool as McpToolInfo

from ._servers import McpServerSpec, StdioServer

__all__ = ["Session", "WatchedReadStream", "list_all_tools", "open_streams"]


async def open_streams(stack: AsyncExitStack, spec: McpServerSpec) -> tuple[Any, Any]:
    """Connect the transport ``spec`` names, on ``stack``: its read and write streams."""
    if isinstance(spec, StdioServer):
        params = StdioServerParameters(
            command=spec.command,
            args=list(spec.args),
            env=dict(spec.env) or None,
            cwd=spec.cwd,
        )
        read, write = await stack.enter_async_context(stdio_client(params, errlog=_child_stderr()))
    elif spec.transport == "sse":
        read, write = await stack.enter_async_context(
            sse_client(
                spec.url,
                headers=dict(spec.headers),
                timeout=spec.timeout,
                sse_read_timeout=spec.sse_read_timeout,
            )
        )
    else:
        http = await stack.enter_async_context(
            httpx2.AsyncClient(
                headers=dict(spec.headers),
                timeout=httpx2.Timeout(spec.timeout, read=spec.sse_read_timeout),
                # Each call holds a connection until its answer: no pool cap (the
                # executor's max_concurrency is the cap), or long calls past 100 at
                # once would wait for a connection and fail the session.
                limits=httpx2.Limits(max_connections=None, max_keepalive_connections=64),
            )
        )
        read, write = await stack.enter_async_context(
            streamable_http_client(spec.url, http_client=http)
        )
    return read, write


def _child_stderr() -> TextIO:
    """Where a stdio server's stderr goes: ours, or the real one when ours has no file
    descriptor (a test runner's capture)."""
    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return sys.__stderr__ if sys.__stderr__ is not None else open(os.devnull, "w")
    return sys.stderr


class WatchedReadStream:
    """The transport's read stream, reporting when the session's reader stops using it
    (the connection ended), so a dead session is noticed before the next call."""

    def __init__(self, stream: Any, on_end: Any) -> None:
        self._stream = stream
        self._on_end = on_end

    @property
    def last_context(self) -> Any:
        return getattr(self._stream, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        item: SessionMessage | Exception = await self._stream.receive()
        return item

    async def aclose(self) -> None:
        self._on_end()
        await self._stream.aclose()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            item: SessionMessage | Exception = await self._stream.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._on_end()
            raise StopAsyncIteration from None
        return item

    async def __aenter__(self) -> Self:
        await self._stream.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        self._on_end()
        result: bool | None = await self._stream.__aexit__(*exc_info)
        return result


class Session:
    """One connection (attempt) to a server; replaced, never reused, once it ends."""

    def __init__(self, generation: int) -> None:
        self.generation = generation
        self.ready = anyio.Event()
        """Set once connected, or once connecting failed (then ``client`` is None)."""
        self.stop = anyio.Event()
        """Set to make the background task close the session."""
        self.closed = anyio.Event()
        """Set when the background task has finished (session and transport closed)."""
        self.scope = anyio.CancelScope()
        self.client: ClientSession | None = None
        self.error: BaseException | None = None
        self.tools: list[McpToolInfo] = []
        self.lost = False
        self.alive_at = -math.inf
        """When a heartbeat ping last succeeded (anyio clock)."""
        self.probe: anyio.Event | None = None
        """Set when the heartbeat ping in progress has finished (None: none running)."""
        self.probe_failed = False
        self.served_by: int | None = None
        """For a server this process supervises: the generation of its process that this
        session was opened on (a restarted server has forgotten the session)."""

    @property
    def replaceable(self) -> bool:
        """Ended, ending or failed: the next call must open a new session."""
        return self.lost or self.stop.is_set() or self.closed.is_set()

    def retire(self) -> None:
        self.stop.set()
        if not self.ready.is_set():
            self.scope.cancel()


async def list_all_tools(client: ClientSession) -> list[McpToolInfo]:
    tools: list[McpToolInfo] = []
    cursor: str | None = None
    for _ in range(1000):  # a server that pages forever cannot hang us
        params = None if cursor is None else PaginatedRequestParams(cursor=cursor)
        page = await client.list_tools(params=params)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            break
    return tools
