"""An MCP server whose tools misbehave on purpose, for testing MCP clients.

Run it with ``python -m toolrollout.apps.mcp_servers.testkit [--transport ...] [--port ...]``;
docs/mcp.md lists the tools and what each does.
"""

from __future__ import annotations

import base64
import io
import json
import os
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import anyio
from mcp.server import stdio as _stdio
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import Context, Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, TextContent

from ._cli import serve

__all__ = [
    "LOG_ENV",
    "ODD_KINDS",
    "RATE_ENV",
    "RATE_LIMITED_CODE",
    "build_server",
    "main",
]

LOG_ENV = "TOOLROLLOUT_TESTKIT_LOG"
"""Environment variable naming the file where ``hang`` records starts and cancellations."""
RATE_ENV = "TOOLROLLOUT_TESTKIT_RATE"
"""Environment variable: calls per second that ``limited`` answers (default 2)."""
RATE_LIMITED_CODE = -32029
"""JSON-RPC error code of a ``limited`` call over the rate (an implementation-defined code)."""

OddKind = Literal[
    "empty",
    "audio",
    "resource_text",
    "resource_blob",
    "resource_link",
    "bad_image",
    "unicode",
    "wire",
]
ODD_KINDS: tuple[str, ...] = OddKind.__args__  # type: ignore[attr-defined]
"""Kinds of ``odd`` content: no content at all; audio; an embedded text resource; an
embedded binary resource; a resource link; an image whose data is not base64 of an image;
text with control and non-ASCII characters; and
``wire``, a JSON-RPC response that does not match the tools/call result schema, written
straight to stdout ahead of the real answer (stdio only; other transports get a text)."""


@dataclass
class _Counters:
    initializes: int = 0
    cancellations: int = 0
    calls: int = 0


def _record(line: str) -> None:
    path = os.environ.get(LOG_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as file:
            file.write(line + "\n")
            file.flush()
            os.fsync(file.fileno())


def _png(width: int, height: int, color: str) -> bytes:
    from PIL import Image as PILImage

    buffer = io.BytesIO()
    PILImage.new("RGB", (width, height), color).save(buffer, format="PNG")
    return buffer.getvalue()


async def _hang(seconds: float = 3600.0, tag: str = "") -> str:
    """Sleep, recording the start and any cancellation in $TOOLROLLOUT_TESTKIT_LOG."""
    _record(f"started {tag}")
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        _record(f"cancelled {tag}")  # plain file I/O: no checkpoint, nothing to shield
        raise
    _record(f"finished {tag}")
    return f"slept {seconds:g}s"


def _fail(message: str = "this tool always fails") -> str:
    """Return an isError result carrying the message."""
    raise ToolError(message)


_ODD_BLOCKS: dict[str, dict[str, Any]] = {
    "audio": {
        "type": "audio",
        "data": base64.b64encode(b"RIFF0000WAVE").decode(),
        "mimeType": "audio/wav",
    },
    "resource_text": {
        "type": "resource",
        "resource": {"uri": "file:///notes.txt", "text": "resource text"},
    },
    "resource_blob": {
        "type": "resource",
        "resource": {
            "uri": "file:///data.bin",
            "mimeType": "application/octet-stream",
            "blob": base64.b64encode(b"\x00\x01\x02").decode(),
        },
    },
    "resource_link": {"type": "resource_link", "uri": "https://example.invalid/doc", "name": "doc"},
    "bad_image": {"type": "image", "data": "this is not base64 of a png!", "mimeType": "image/png"},
    "unicode": {"type": "text", "text": "tab\tnul\x00 émoji 🧪 \u202e"},
}
"""The one content block of each ``odd`` kind but ``empty`` and ``wire``, in wire form."""


async def _odd(kind: OddKind, ctx: Context) -> CallToolResult:
    """Return unusual or malformed content of the given kind."""
    if kind != "wire":
        blocks = [_ODD_BLOCKS[kind]] if kind in _ODD_BLOCKS else []
        return CallToolResult.model_validate({"content": blocks})
    # "wire": answer this request with a result that breaks the schema, straight on stdout.
    request_id: int | str = ctx.request_id
    if isinstance(request_id, str) and request_id.isdigit():
        request_id = int(request_id)
    bogus = {"jsonrpc": "2.0", "id": request_id, "result": {"content": "not a list"}}
    # The stdio transport moves the protocol stream off fd 1 (so stray prints cannot
    # corrupt it); its private duplicate is the wire. A test hack, hence the private name.
    claim = getattr(_stdio, "_claims", {}).get(1)
    wire = getattr(claim, "private_fd", None)
    if wire is None:
        return CallToolResult(content=[TextContent(text="no stdio wire to corrupt")])
    os.write(wire, (json.dumps(bogus) + "\n").encode())
    return CallToolResult(content=[TextContent(text="the wire result was sent first")])


def build_server() -> MCPServer[Any]:
    """A fresh testkit server with its own counters."""
    counters = _Counters()
    calls: deque[float] = deque()
    rate = float(os.environ.get(RATE_ENV, "2"))

    async def count(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.method == "initialize":
            counters.initializes += 1
        elif ctx.method == "notifications/cancelled":
            counters.cancellations += 1
        elif ctx.method == "tools/call":
            counters.calls += 1
        return await call_next(ctx)

    server: MCPServer[Any] = MCPServer(
        "testkit",
        instructions="Tools that misbehave on purpose, for testing MCP clients.",
        log_level="WARNING",
        middleware=[count],
    )

    @server.tool(structured_output=False)
    def echo(text: str) -> str:
        """Return the text unchanged."""
        return text

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool()
    def stats() -> dict[str, int]:
        """The server's pid and the requests it has seen."""
        return {
            "pid": os.getpid(),
            "initializes": counters.initializes,
            "cancellations": counters.cancellations,
            "calls": counters.calls,
        }

    server.tool(name="hang", structured_output=False)(_hang)

    @server.tool(structured_output=False)
    def image(width: int = 8, height: int = 6, color: str = "red") -> list[Any]:
        """A caption and a PNG image of one color."""
        return [f"a {width}x{height} {color} image", Image(data=_png(width, height, color))]

    server.tool(name="fail", structured_output=False)(_fail)

    server.tool(name="odd")(_odd)

    @server.tool(structured_output=False)
    def crash(exit_code: int = 3, once_marker: str = "") -> str:
        """Kill the server process mid-call (only once per marker file, when one is given)."""
        if once_marker:
            marker = Path(once_marker)
            if marker.exists():
                return "survived: the marker exists"
            marker.touch()
        os._exit(exit_code)

    @server.tool(structured_output=False)
    async def limited() -> str:
        """Answer at most $TOOLROLLOUT_TESTKIT_RATE calls per second; error past that."""
        now = time.monotonic()
        while calls and now - calls[0] >= 1.0:
            calls.popleft()
        if len(calls) >= rate:
            raise MCPError(
                code=RATE_LIMITED_CODE,
                message=f"rate limit exceeded: at most {rate:g} calls per second",
            )
        calls.append(now)
        return "ok"

    return server


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``python -m toolrollout.apps.mcp_servers.testkit``."""
    serve(build_server(), argv)


if __name__ == "__main__":
    main()
