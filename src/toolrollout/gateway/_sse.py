"""Server-sent events for the gateway's streaming answers (Responses and Messages).

Both APIs name each event in an ``event:`` line and repeat the name as ``type`` in the
JSON ``data:`` line; neither ends with OpenAI chat's ``data: [DONE]``. The engine call is
token-in/token-out, so a stream is written from a finished turn: the events are the ones
the SDKs' accumulators expect, in their order, with each block's text in one delta.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from typing import Any

from starlette.responses import StreamingResponse

__all__ = ["sse_bytes", "sse_response"]


def sse_bytes(event: dict[str, Any]) -> bytes:
    """One event, named by its ``type``, as the bytes of an SSE frame."""
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


def sse_response(events: Iterable[dict[str, Any]]) -> StreamingResponse:
    """A ``text/event-stream`` answer that writes ``events`` in order."""

    frames_ = [sse_bytes(event) for event in events]

    async def frames() -> AsyncIterator[bytes]:  # async: no thread-pool hop per frame
        for frame in frames_:
            yield frame

    return StreamingResponse(
        frames(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
