"""OpenAI Chat Completions (``POST /v1/chat/completions``), streaming and not.

The request is validated with the same pydantic model ``toolrollout serve`` uses
(:class:`~toolrollout.apps.server._openai.ChatCompletionRequest`) and becomes one
:class:`ChatRequest`; the answer has OpenAI's ``chat.completion`` shape, or with
``stream: true`` ``chat.completion.chunk`` server-sent events ending in ``data: [DONE]``
(:class:`ChatStreamWriter`), sent as the engine decodes the tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from starlette.responses import Response

from toolrollout.apps.server._openai import ChatCompletionRequest, validate_body

from ._http import (
    Callers,
    answer,
    openai_error,
    openai_error_body,
    read_json,
    request_metadata,
)
from ._parts import chat_call
from ._sse import Frame, data_bytes
from ._types import ChatRequest, ChatResult, GatewayError, StreamDelta, StreamStart, invalid

if TYPE_CHECKING:
    from ._core import Gateway

__all__ = [
    "add_chat_routes",
    "chat_completion_body",
    "chat_request_from_openai",
]


def chat_request_from_openai(body: Any, *, session: str, metadata: dict[str, Any]) -> ChatRequest:
    """A Chat Completions body as the gateway's request; :class:`GatewayError` if invalid."""
    parsed = validate_body(ChatCompletionRequest, body, invalid)
    tools = tuple(parsed.tools or ())
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise invalid(f"tools[{i}]: only function tools are supported")
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
            "tool_calls": [chat_call(c.id, c.name, c.arguments) for c in choice.tool_calls] or None,
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


class ChatStreamWriter:
    """``chat.completion.chunk`` events of a streamed answer: the role, the reasoning and
    content deltas as they come, then each tool call (name and arguments in one delta, once
    the turn is parsed), the finish reason and, with ``include_usage``, the usage chunk.
    With ``n > 1`` (``whole``) every choice's chunks come at the end, one choice after
    another. An error after the start is a ``data: {"error": ...}`` line, which the
    ``openai`` SDK raises as an ``APIError``."""

    def __init__(self, start: StreamStart, *, include_usage: bool, whole: bool = False) -> None:
        self._head = {
            "id": start.id,
            "object": "chat.completion.chunk",
            "created": start.created,
            "model": start.model,
        }
        self._include_usage = include_usage
        self._whole = whole

    def _chunk(self, delta: dict[str, Any], finish: str | None = None, index: int = 0) -> Frame:
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        out = {**self._head, "choices": [choice]}
        if self._include_usage:
            out["usage"] = None
        return out

    def begin(self) -> list[Frame]:
        return [] if self._whole else [self._chunk({"role": "assistant", "content": ""})]

    def delta(self, delta: StreamDelta) -> list[Frame]:
        key = "reasoning_content" if delta.kind == "reasoning" else "content"
        return [self._chunk({key: delta.text})]

    def finish(self, result: ChatResult) -> list[Frame]:
        chunks: list[Frame] = []
        for choice in result.choices:
            index = choice.index
            if self._whole:
                chunks.append(self._chunk({"role": "assistant", "content": ""}, index=index))
                if choice.reasoning:
                    chunks.append(self._chunk({"reasoning_content": choice.reasoning}, None, index))
                if choice.content:
                    chunks.append(self._chunk({"content": choice.content}, None, index))
            for position, call in enumerate(choice.tool_calls):
                delta = {
                    "tool_calls": [
                        {"index": position, **chat_call(call.id, call.name, call.arguments)}
                    ]
                }
                chunks.append(self._chunk(delta, None, index))
            chunks.append(self._chunk({}, choice.finish_reason, index))
        if self._include_usage:
            chunks.append({**self._head, "choices": [], "usage": _usage(result)})
        return chunks

    def error(self, exc: GatewayError) -> list[Frame]:
        return [openai_error_body(exc)]


def add_chat_routes(app: FastAPI, gateway: Gateway) -> None:
    """Register ``POST /v1/chat/completions`` and ``GET /v1/models``."""
    callers: Callers = app.state.callers

    @app.post("/v1/chat/completions")
    async def chat_completions(http_request: Request) -> Response:
        try:
            body = await read_json(http_request, empty=b"{}", error="JSON decode error")
            request = chat_request_from_openai(
                body, session=callers.session(http_request), metadata=request_metadata(http_request)
            )
            options = body.get("stream_options") or {}
            include = bool(isinstance(options, dict) and options.get("include_usage"))
            return await answer(
                gateway,
                http_request,
                request,
                stream=bool(body.get("stream")),
                whole=chat_completion_body,
                writer=lambda start: ChatStreamWriter(
                    start, include_usage=include, whole=request.n != 1
                ),
                encode=data_bytes,
                tail=b"data: [DONE]\n\n",
            )
        except GatewayError as exc:
            return openai_error(exc)

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
