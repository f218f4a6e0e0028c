"""The OpenAI Responses API's request model and its answer (``_responses.py`` serves it).

The ``output`` lists a ``reasoning`` item (when the family separates reasoning), a
``message`` item and one ``function_call`` item per parsed call: the order they come back
in on the next request, so a harness that replays ``output`` extends its segment.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ._types import ChatChoice, ChatResult, GatewayError, StreamDelta, ToolCallOut

__all__ = [
    "ResponseStreamWriter",
    "ResponsesRequest",
    "new_id",
    "output_items",
    "response_object",
]


class ResponsesRequest(BaseModel):
    """The fields of a Responses request the gateway reads (others are accepted, unused)."""

    model_config = ConfigDict(extra="allow")

    model: str = ""
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] = Field(default_factory=list)
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stream: bool = False
    store: bool | None = None
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def output_items(choice: ChatChoice) -> list[dict[str, Any]]:
    """The ``output`` of one choice: reasoning, message, then one item per call."""
    status = "incomplete" if choice.finish_reason == "length" else "completed"
    items: list[dict[str, Any]] = []
    if choice.reasoning is not None:
        items.append(_text_item("reasoning", new_id("rs"), choice.reasoning, status))
    if choice.content or not choice.tool_calls:
        items.append(_text_item("message", new_id("msg"), choice.content, status))
    items.extend(_function_call_item(call, status) for call in choice.tool_calls)
    return items


def _text_item(kind: str, item_id: str, text: str, status: str) -> dict[str, Any]:
    """A ``reasoning`` item or an assistant ``message`` item that holds ``text``."""
    if kind == "reasoning":
        part: dict[str, Any] = {"type": "reasoning_text", "text": text}
        return {"id": item_id, "type": kind, "summary": [], "content": [part], "status": status}
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"id": item_id, "type": kind, "role": "assistant", "status": status, "content": [part]}


def _function_call_item(call: ToolCallOut, status: str) -> dict[str, Any]:
    return {
        "id": new_id("fc"),
        "type": "function_call",
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
        "status": status,
    }


def response_object(
    result: ChatResult,
    request: ResponsesRequest,
    *,
    response_id: str,
    output: list[dict[str, Any]],
    store: bool = False,
) -> dict[str, Any]:
    """The ``response`` object: completed, or incomplete at the token cap."""
    truncated = result.choices[0].finish_reason == "length"
    body = _shell(
        request,
        response_id=response_id,
        created=result.created,
        model=result.model or request.model,
        store=store,
    )
    body.update(
        status="incomplete" if truncated else "completed",
        incomplete_details={"reason": "max_output_tokens"} if truncated else None,
        output=output,
        usage=_usage(result),
    )
    return body


def _shell(
    request: ResponsesRequest, *, response_id: str, created: int, model: str, store: bool
) -> dict[str, Any]:
    """A ``response`` object in progress: no output, no usage yet."""
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "model": model,
        "output": [],
        "parallel_tool_calls": request.parallel_tool_calls,
        "previous_response_id": request.previous_response_id,
        "reasoning": {"effort": None, "summary": None},
        "store": store,
        "temperature": request.temperature,
        "text": {"format": {"type": "text"}},
        "tool_choice": request.tool_choice if request.tool_choice is not None else "auto",
        "tools": request.tools,
        "top_p": request.top_p,
        "truncation": "disabled",
        "usage": None,
        "user": None,
        "metadata": request.metadata or {},
    }


def _usage(result: ChatResult) -> dict[str, Any]:
    return {
        "input_tokens": result.prompt_tokens,
        "input_tokens_details": {"cached_tokens": result.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": result.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": result.prompt_tokens + result.completion_tokens,
    }


class ResponseStreamWriter:
    """The events of a streamed response, in the order OpenAI documents and the SDK checks:
    ``response.created``, ``response.in_progress``, then per output item
    ``output_item.added``, its ``content_part.added`` and text deltas as they come (a
    ``reasoning`` item, then the ``message``), its ``.done`` events and
    ``output_item.done``; once the turn is parsed, one ``function_call`` item per call and
    ``response.completed`` (``response.incomplete`` at the token cap). An error after the
    start ends the stream with ``response.failed``."""

    def __init__(
        self,
        request: ResponsesRequest,
        *,
        response_id: str,
        created: int,
        model: str,
        store: bool = False,
        on_final: Callable[[dict[str, Any]], object] | None = None,
    ) -> None:
        self._request = request
        self._shell = _shell(
            request, response_id=response_id, created=created, model=model, store=store
        )
        self._store = store
        self._on_final = on_final
        self._events = 0
        self._items: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None
        self._text = ""

    def _emit(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._events, **fields}
        self._events += 1
        return event

    def begin(self) -> list[dict[str, Any]]:
        return [
            self._emit(kind, response=dict(self._shell))
            for kind in ("response.created", "response.in_progress")
        ]

    def _where(self) -> dict[str, Any]:
        assert self._open is not None
        return {"item_id": self._open["id"], "output_index": len(self._items)}

    def _start(self, kind: str) -> list[dict[str, Any]]:
        events = self._close("completed")
        item = _text_item(kind, new_id("rs" if kind == "reasoning" else "msg"), "", "in_progress")
        part = item["content"][0]
        self._open, self._text = dict(item, content=[]), ""
        events.append(
            self._emit("response.output_item.added", output_index=len(self._items), item=self._open)
        )
        events.append(
            self._emit("response.content_part.added", **self._where(), content_index=0, part=part)
        )
        return events

    def _close(self, status: str) -> list[dict[str, Any]]:
        item = self._open
        if item is None:
            return []
        where = self._where()
        final = _text_item(item["type"], item["id"], self._text, status)
        part = final["content"][0]
        events = [
            self._text_event("done", text=self._text),
            self._emit("response.content_part.done", **where, content_index=0, part=part),
            self._emit("response.output_item.done", output_index=len(self._items), item=final),
        ]
        self._items.append(final)
        self._open = None
        return events

    def _kind(self) -> str | None:
        return None if self._open is None else str(self._open["type"])

    def delta(self, delta: StreamDelta) -> list[dict[str, Any]]:
        kind = "reasoning" if delta.kind == "reasoning" else "message"
        events = self._start(kind) if self._kind() != kind else []
        self._text += delta.text
        events.append(self._text_event("delta", delta=delta.text))
        return events

    def _text_event(self, suffix: str, **fields: Any) -> dict[str, Any]:
        """A ``reasoning_text`` or ``output_text`` (with ``logprobs``) event of the open item."""
        where = self._where()
        if self._kind() == "reasoning":
            return self._emit(
                f"response.reasoning_text.{suffix}", **where, content_index=0, **fields
            )
        name = f"response.output_text.{suffix}"
        return self._emit(name, **where, content_index=0, **fields, logprobs=[])

    def finish(self, result: ChatResult) -> list[dict[str, Any]]:
        choice = result.choices[0]
        status = "incomplete" if choice.finish_reason == "length" else "completed"
        seen = {item["type"] for item in self._items} | {self._kind()}
        events: list[dict[str, Any]] = []
        if choice.reasoning is not None and not seen & {"reasoning", "message"}:
            events += self._start("reasoning") + self._close(status)
        if "message" not in seen and (choice.content or not choice.tool_calls):
            events += self._start("message")
        events += self._close(status)
        for call in choice.tool_calls:
            item = _function_call_item(call, status)
            at = {"output_index": len(self._items)}
            where, args = {"item_id": item["id"], **at}, call.arguments
            started = dict(item, status="in_progress", arguments="")
            events.append(self._emit("response.output_item.added", **at, item=started))
            events.append(self._emit("response.function_call_arguments.delta", **where, delta=args))
            done = "response.function_call_arguments.done"
            events.append(self._emit(done, **where, name=call.name, arguments=args))
            events.append(self._emit("response.output_item.done", **at, item=item))
            self._items.append(item)
        final = response_object(
            result,
            self._request,
            response_id=self._shell["id"],
            output=self._items,
            store=self._store,
        )
        final["created_at"] = self._shell["created_at"]
        if self._on_final is not None:
            self._on_final(final)
        events.append(self._emit(f"response.{final['status']}", response=final))
        return events

    def error(self, exc: GatewayError) -> list[dict[str, Any]]:
        failed = dict(
            self._shell,
            status="failed",
            output=self._items,
            error={"code": "server_error", "message": exc.message},
        )
        return [self._emit("response.failed", response=failed)]
