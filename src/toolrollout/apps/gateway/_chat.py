"""OpenAI Chat Completions (``POST /v1/chat/completions``), streaming and not.

The request is validated with the same pydantic model ``toolrollout serve`` uses
(:class:`~toolrollout.apps.server._openai.ChatCompletionRequest`) and becomes one
:class:`ChatRequest`; the answer has OpenAI's ``chat.completion`` shape, or with
``stream: true`` a series of ``chat.completion.chunk`` server-sent events ending in
``data: [DONE]``, sent as the engine decodes the tokens (:meth:`Gateway.stream`): one role
chunk, reasoning and content deltas as soon as they cannot be part of a tool call, then
each tool call (name and arguments in one delta, once the turn is parsed), the finish
reason and, with ``stream_options.include_usage``, a usage chunk. With ``n > 1`` the
chunks of every choice are sent once all are done.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from toolrollout.apps.server._openai import ChatCompletionRequest, validate_body

from ._http import (
    complete_or_abort,
    open_stream,
    openai_error,
    openai_error_body,
    request_metadata,
    session_key,
)
from ._parts import invalid
from ._sse import data_bytes, relay, stream_response
from ._types import (
    ChatChoice,
    ChatRequest,
    ChatResult,
    GatewayError,
    StreamDelta,
    StreamStart,
    ToolCallOut,
)

if TYPE_CHECKING:
    from ._core import Gateway

__all__ = [
    "add_chat_routes",
    "chat_completion_body",
    "chat_request_from_openai",
    "stream_chunks",
]


def chat_request_from_openai(body: Any, *, session: str, metadata: dict[str, Any]) -> ChatRequest:
    """A Chat Completions body as the gateway's request; :class:`GatewayError` if invalid."""
    parsed = validate_body(ChatCompletionRequest, body, invalid)
    tools = tuple(parsed.tools or ())
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise GatewayError(
                "invalid_request", f"tools[{i}]: only function tools are supported", status=400
            )
    stop = (parsed.stop,) if isinstance(parsed.stop, str) else tuple(parsed.stop or ())
    seed = {"seed": parsed.seed} if parsed.seed is not None else {}
    return ChatRequest(
        session=session,
        messages=tuple(parsed.messages),
        tools=tools,
        tool_choice=parsed.tool_choice,
        n=parsed.n,
        max_tokens=parsed.max_completion_tokens or parsed.max_tokens,
        temperature=parsed.temperature,
        top_p=parsed.top_p,
        top_k=parsed.top_k,
        stop=stop,
        model=parsed.model or "",
        metadata={**metadata, **seed},
    )


def _tool_calls(choice: ChatChoice) -> list[dict[str, Any]] | None:
    if not choice.tool_calls:
        return None
    return [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in choice.tool_calls
    ]


def _usage(result: ChatResult) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "total_tokens": result.prompt_tokens + result.completion_tokens,
    }
    if result.cached_tokens:
        usage["prompt_tokens_details"] = {"cached_tokens": result.cached_tokens}
    return usage


def chat_completion_body(result: ChatResult) -> dict[str, Any]:
    """The ``chat.completion`` object of a result (every choice)."""
    choices = []
    for choice in result.choices:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": choice.content or None,
            "tool_calls": _tool_calls(choice),
        }
        if choice.reasoning is not None:
            message["reasoning_content"] = choice.reasoning
        choices.append(
            {
                "index": choice.index,
                "message": message,
                "logprobs": None,
                "finish_reason": choice.finish_reason,
            }
        )
    return {
        "id": result.id,
        "object": "chat.completion",
        "created": result.created,
        "model": result.model,
        "choices": choices,
        "usage": _usage(result),
    }


def stream_chunks(result: ChatResult, *, include_usage: bool) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects a stream of ``result`` sends, in order."""
    head = {
        "id": result.id,
        "object": "chat.completion.chunk",
        "created": result.created,
        "model": result.model,
    }

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        out = {
            **head,
            "choices": [
                {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
            ],
        }
        if include_usage:
            out["usage"] = None
        return out

    chunks: list[dict[str, Any]] = []
    for choice in result.choices:
        chunks.append(chunk(choice.index, {"role": "assistant", "content": ""}))
        if choice.reasoning:
            chunks.append(chunk(choice.index, {"reasoning_content": choice.reasoning}))
        if choice.content:
            chunks.append(chunk(choice.index, {"content": choice.content}))
        for position, call in enumerate(choice.tool_calls):
            delta = {
                "tool_calls": [
                    {
                        "index": position,
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments},
                    }
                ]
            }
            chunks.append(chunk(choice.index, delta))
        chunks.append(chunk(choice.index, {}, choice.finish_reason))
    if include_usage:
        chunks.append({**head, "choices": [], "usage": _usage(result)})
    return chunks


class ChatStreamWriter:
    """``chat.completion.chunk`` events of a streamed answer with one choice: the role, the
    reasoning and content deltas as they come, then each tool call (name and arguments in
    one delta, once the turn is parsed), the finish reason and, with ``include_usage``, the
    usage chunk. An error after the start is a ``data: {"error": ...}`` line, which the
    ``openai`` SDK raises as an ``APIError``."""

    def __init__(self, start: StreamStart, *, include_usage: bool) -> None:
        self._head = {
            "id": start.id,
            "object": "chat.completion.chunk",
            "created": start.created,
            "model": start.model,
        }
        self._include_usage = include_usage

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        out = {
            **self._head,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if self._include_usage:
            out["usage"] = None
        return out

    def begin(self) -> list[dict[str, Any]]:
        return [self._chunk({"role": "assistant", "content": ""})]

    def delta(self, delta: StreamDelta) -> list[dict[str, Any]]:
        key = "reasoning_content" if delta.kind == "reasoning" else "content"
        return [self._chunk({key: delta.text})]

    def finish(self, result: ChatResult) -> list[dict[str, Any]]:
        choice = result.choices[0]
        chunks = [
            self._chunk(_call_delta(position, call))
            for position, call in enumerate(choice.tool_calls)
        ]
        chunks.append(self._chunk({}, choice.finish_reason))
        if self._include_usage:
            chunks.append({**self._head, "choices": [], "usage": _usage(result)})
        return chunks

    def error(self, exc: GatewayError) -> list[dict[str, Any]]:
        return [openai_error_body(exc)]


def _call_delta(position: int, call: ToolCallOut) -> dict[str, Any]:
    return {
        "tool_calls": [
            {
                "index": position,
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
        ]
    }


async def _known(chunks: list[dict[str, Any]]) -> AsyncIterator[bytes]:
    for item in chunks:
        yield data_bytes(item)
    yield _DONE


_DONE = b"data: [DONE]\n\n"


def add_chat_routes(app: FastAPI, gateway: Gateway) -> None:
    """Register ``POST /v1/chat/completions`` and ``GET /v1/models``."""

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(http_request: Request) -> JSONResponse | StreamingResponse:
        try:
            try:
                body = json.loads(await http_request.body() or b"{}")
            except ValueError as exc:
                raise GatewayError(
                    "invalid_request", f"JSON decode error: {exc}", status=400
                ) from None
            request = chat_request_from_openai(
                body, session=session_key(http_request), metadata=request_metadata(http_request)
            )
            stream = isinstance(body, dict) and bool(body.get("stream"))
            if not stream:
                whole = await complete_or_abort(gateway, http_request, request)
                return JSONResponse(chat_completion_body(whole))
            options = body.get("stream_options") or {}
            include = bool(isinstance(options, dict) and options.get("include_usage"))
            start, items = await open_stream(gateway, http_request, request)
        except GatewayError as exc:
            return openai_error(exc)
        if request.n != 1:
            result: ChatResult | None = None
            async for item in items:
                if isinstance(item, ChatResult):
                    result = item
            assert result is not None
            return stream_response(_known(stream_chunks(result, include_usage=include)))
        writer = ChatStreamWriter(start, include_usage=include)
        return stream_response(relay(items, writer, data_bytes, tail=_DONE))

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": gateway.config.model_name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "toolrollout",
                }
            ],
        }
