"""SGLang's ``/generate`` on the embedded engine: one sample or a batch, answered whole or
as cumulative SSE chunks (the request is parsed by ``_protocol.py``)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from http import HTTPStatus
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from toolrollout._exceptions import EngineError, EngineRequestRejected, ToolRolloutError, UserError
from toolrollout.apps.server._answers import (
    DONE,
    dumps,
    error_response,
    json_body,
    json_response,
    stream_error_chunk,
    validation_error_response,
)
from toolrollout.apps.server._protocol import (
    BadRequest,
    MalformedRequest,
    ParsedGenerate,
    output_json,
    parse_generate,
)
from toolrollout.engines._types import token_id_array
from toolrollout.engines.embedded import EmbeddedEngine, EmbeddedOutput
from toolrollout.engines.embedded._scheduler import Event
from toolrollout.engines.embedded._vision import VisionInputs

__all__ = ["GenerateRoute"]

_DISCONNECT_POLL = 1.0
"""How often a non-streaming request checks whether its client is still there."""


class GenerateRoute:
    """``/generate``: one sample or a batch, answered whole or as cumulative SSE chunks."""

    def __init__(self, engine: EmbeddedEngine) -> None:
        self.engine = engine

    def decode_one(self, token_id: int) -> str:
        return str(self.engine.tokenizer.decode([token_id]))

    async def route(self, request: Request) -> Response:
        engine = self.engine
        try:
            body = await json_body(request)
            parsed = parse_generate(
                body, tokenize=engine.tokenize, context_length=engine.context_length
            )
        except MalformedRequest as exc:
            return validation_error_response(str(exc))
        except BadRequest as exc:
            # SGLang validates inside the response stream: a streaming request gets its
            # error as an SSE chunk with HTTP 200.
            if isinstance(body, dict) and body.get("stream") is True:
                chunks = [stream_error_chunk(str(exc)), DONE]
                return StreamingResponse(iter(chunks), media_type="text/event-stream")
            return error_response(str(exc))
        if parsed.stream:
            return StreamingResponse(self._stream(parsed), media_type="text/event-stream")
        return await self._complete(parsed, request)

    async def _images(self, parsed: ParsedGenerate) -> list[VisionInputs | None]:
        """Pixel inputs of every sample, computed off the event loop (shared by its n)."""
        out: list[VisionInputs | None] = []
        done: dict[tuple[int, bytes], VisionInputs | None] = {}
        for sub in parsed.subs:
            key = (id(sub.request.image_data), token_id_array(sub.request.input_ids).tobytes())
            if key not in done:
                done[key] = await self.engine.process_images(sub.request)
            out.append(done[key])
        return out

    async def _submit_all(
        self, parsed: ParsedGenerate, queue: asyncio.Queue[tuple[int, Event]]
    ) -> list[str]:
        """Submit every sample; on a rejection cancel the ones already queued."""
        visions = await self._images(parsed)
        rids: list[str] = []
        try:
            for i, sub in enumerate(parsed.subs):
                sink = functools.partial(_put, queue, i)
                rids.append(
                    self.engine.submit(sub.request, sub.options, sink=sink, vision=visions[i])
                )
        except BaseException:
            for rid in rids:
                self.engine.cancel(rid)
            raise
        return rids

    async def _complete(self, parsed: ParsedGenerate, request: Request) -> Response:
        queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
        await self.engine.wait_unpaused()
        try:
            rids = await self._submit_all(parsed, queue)
        except (EngineRequestRejected, UserError) as exc:
            return error_response(str(exc))
        except EngineError as exc:
            return error_response(str(exc), HTTPStatus.SERVICE_UNAVAILABLE)
        results: list[dict[str, Any] | None] = [None] * len(rids)
        pending = set(range(len(rids)))
        try:
            while pending:
                try:
                    i, event = await asyncio.wait_for(queue.get(), _DISCONNECT_POLL)
                except TimeoutError:
                    if await request.is_disconnected():
                        return error_response(
                            "Request is disconnected from the client side. "
                            f"Abort request rid={rids}"
                        )
                    continue
                if isinstance(event, EngineError):
                    return error_response(str(event), HTTPStatus.INTERNAL_SERVER_ERROR)
                if event.finished:
                    out = output_json(event, parsed.subs[i], self.decode_one, first_sent=True)
                    results[i] = out
                    pending.discard(i)
        finally:
            for i in pending:
                self.engine.cancel(rids[i])
        return json_response(results[0] if parsed.single else results)

    async def _stream(self, parsed: ParsedGenerate) -> AsyncIterator[bytes]:
        """Cumulative SSE chunks (SGLang's default), ``index`` for batches, then [DONE]."""
        queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
        await self.engine.wait_unpaused()
        try:
            rids = await self._submit_all(parsed, queue)
        except ToolRolloutError as exc:
            yield stream_error_chunk(str(exc))
            yield DONE
            return
        pending = set(range(len(rids)))
        unsent = set(pending)
        try:
            while pending:
                events = [await queue.get()]
                while not queue.empty():  # chunks are cumulative: only the newest matters
                    events.append(queue.get_nowait())
                latest: dict[int, EmbeddedOutput] = {}
                for i, event in events:
                    if isinstance(event, EngineError):
                        pending.discard(i)
                        yield stream_error_chunk(str(event))
                    elif i in pending:
                        latest[i] = event
                for i, out in latest.items():
                    chunk = output_json(
                        out, parsed.subs[i], self.decode_one, first_sent=i in unsent
                    )
                    unsent.discard(i)
                    if not parsed.single:
                        chunk["index"] = i
                    if out.finished:
                        pending.discard(i)
                    yield b"data: " + dumps(chunk).encode() + b"\n\n"
            yield DONE
        finally:  # the client went away (the task is cancelled) or we are done
            for i in pending:
                self.engine.cancel(rids[i])


def _put(queue: asyncio.Queue[tuple[int, Event]], i: int, event: Event) -> None:
    queue.put_nowait((i, event))
