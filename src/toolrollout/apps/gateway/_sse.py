"""Server-sent events for the gateway's streaming answers.

Responses and Messages name each event in an ``event:`` line and repeat the name as
``type`` in the JSON ``data:`` line, and neither ends with a sentinel; Chat Completions
sends bare ``data:`` lines and ends with ``data: [DONE]``. Each API has a *writer* that
turns the gateway's stream (:class:`StreamStart`, :class:`StreamDelta` s, the
:class:`ChatResult`) into its events; :func:`relay` drives one over a live stream, so the
events leave as the tokens are generated, and an error after the start becomes the API's
in-stream error event.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any, Protocol

from starlette.responses import StreamingResponse

from ._types import ChatResult, GatewayError, StreamDelta, StreamStart

__all__ = ["Frame", "StreamWriter", "data_bytes", "relay", "sse_bytes", "stream_response"]

Frame = dict[str, Any]


class StreamWriter(Protocol):
    """One API's events for a streamed answer."""

    def begin(self) -> list[Frame]: ...

    def delta(self, delta: StreamDelta) -> list[Frame]: ...

    def finish(self, result: ChatResult) -> list[Frame]: ...

    def error(self, exc: GatewayError) -> list[Frame]: ...


def sse_bytes(event: Frame) -> bytes:
    """One event, named by its ``type``, as the bytes of an SSE frame."""
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


def data_bytes(event: Frame) -> bytes:
    """One Chat Completions chunk: a bare ``data:`` line."""
    return f"data: {json.dumps(event, ensure_ascii=False)}\n\n".encode()


async def relay(
    items: AsyncGenerator[StreamStart | StreamDelta | ChatResult, None],
    writer: StreamWriter,
    encode: Callable[[Frame], bytes],
    *,
    tail: bytes = b"",
) -> AsyncIterator[bytes]:
    """The frames of a live stream whose start was taken already (the writer's ``begin``
    first). Closing this (the client went away) closes the stream, which aborts the
    generation; an error after the start is sent as the API's error event."""
    for event in writer.begin():
        yield encode(event)
    try:
        async with contextlib.aclosing(items):
            async for item in items:
                if isinstance(item, StreamDelta):
                    events = writer.delta(item)
                elif isinstance(item, ChatResult):
                    events = writer.finish(item)
                else:
                    continue
                for event in events:
                    yield encode(event)
    except GatewayError as exc:
        for event in writer.error(exc):
            yield encode(event)
        return
    if tail:
        yield tail


def stream_response(frames: AsyncIterator[bytes]) -> StreamingResponse:
    """A ``text/event-stream`` answer that sends ``frames`` as they come."""
    return StreamingResponse(
        frames,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
