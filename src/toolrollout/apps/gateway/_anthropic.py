"""Anthropic Messages API (``POST /v1/messages``) in front of the gateway's core.

Content blocks become OpenAI chat messages and the answer's blocks are built from the
parsed turn, so a harness that appends the answer as it came extends its session; errors
carry Anthropic's envelope and status codes. See docs/gateway.md.
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from toolrollout.apps.server._openai import validate_body

from ._http import Callers, answer, read_json, request_metadata
from ._parts import chat_call, chat_content, function_tools, require_str, tool_message
from ._types import (
    ChatChoice,
    ChatRequest,
    ChatResult,
    GatewayError,
    StreamDelta,
    StreamStart,
    invalid,
)

if TYPE_CHECKING:
    from ._core import Gateway

__all__ = [
    "MessageStreamWriter",
    "MessagesRequest",
    "add_anthropic_routes",
    "anthropic_error",
    "anthropic_messages",
    "message_object",
    "messages_to_chat",
    "parse_messages_request",
]


class MessagesRequest(BaseModel):
    """The fields of a Messages request the gateway reads (others are accepted, unused)."""

    model_config = ConfigDict(extra="allow")

    model: str = ""
    max_tokens: int = Field(ge=1)
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] = Field(default_factory=list)
    tool_choice: dict[str, Any] | None = None
    stop_sequences: list[str] = Field(default_factory=list)
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=1)
    stream: bool = False


def parse_messages_request(body: Any, *, count_only: bool = False) -> MessagesRequest:
    """Validate a request body; a 400 :class:`GatewayError` with one readable line.
    ``count_only``: a ``count_tokens`` body, which has no ``max_tokens``."""
    if count_only and isinstance(body, dict):
        body = {**body, "max_tokens": 1}
    return validate_body(MessagesRequest, body, invalid)


def messages_to_chat(
    request: MessagesRequest, session: str, *, metadata: dict[str, Any] | None = None
) -> ChatRequest:
    """The canonical request of a validated Messages request (``metadata``: the
    per-request options of the HTTP layer, such as the GRPO group)."""
    return ChatRequest(
        session=session,
        messages=tuple(anthropic_messages(request.system, request.messages)),
        tools=function_tools(request.tools, kinds=(None, "custom"), schema="input_schema"),
        tool_choice=_chat_tool_choice(request.tool_choice),
        max_tokens=request.max_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        top_k=request.top_k,
        stop=tuple(request.stop_sequences),
        model=request.model,
        metadata={**(metadata or {}), "api": "anthropic"},
    )


def anthropic_messages(
    system: str | list[dict[str, Any]] | None, messages: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """OpenAI chat messages of ``system`` and the Messages ``messages``."""
    out: list[dict[str, Any]] = []
    if isinstance(system, str):
        if system:
            out.append({"role": "system", "content": system})
    elif system:
        parts = [_text_part(block, f"system[{j}]") for j, block in enumerate(system)]
        out.append({"role": "system", "content": chat_content(parts)})
    call_names: dict[str, str] = {}
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        role, content = message.get("role"), message.get("content")
        if isinstance(content, str):
            if role not in ("user", "assistant"):
                raise invalid(f"{where}.role: expected user or assistant")
            out.append({"role": role, "content": content})
        elif not isinstance(content, list):
            raise invalid(f"{where}.content: expected a string or a list of blocks")
        elif role == "user":
            out.extend(_user_messages(content, where, call_names))
        elif role == "assistant":
            out.append(_assistant_message(content, where, call_names))
        else:
            raise invalid(f"{where}.role: expected user or assistant")
    return out


def _text_part(block: Any, where: str) -> dict[str, Any]:
    if not isinstance(block, dict) or block.get("type") != "text":
        raise invalid(f"{where}: expected a text block")
    return {"type": "text", "text": require_str(block.get("text"), f"{where}.text")}


def _image_part(block: dict[str, Any], where: str) -> dict[str, Any]:
    source = block.get("source") or {}
    if source.get("type") == "base64":
        url = f"data:{source.get('media_type')};base64,{source.get('data')}"
    elif source.get("type") == "url":
        url = require_str(source.get("url"), f"{where}.source.url")
    else:
        raise invalid(f"{where}.source: {source.get('type')!r} image sources are not supported")
    return {"type": "image_url", "image_url": {"url": url}}


def _user_messages(
    blocks: list[Any], where: str, call_names: dict[str, str]
) -> list[dict[str, Any]]:
    """One user message per run of text/image blocks, one tool message per result."""
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []

    def flush() -> None:
        if parts:
            out.append({"role": "user", "content": chat_content(list(parts))})
            parts.clear()

    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            parts.append(_text_part(block, at))
        elif kind == "image":
            parts.append(_image_part(block, at))
        elif kind == "tool_result":
            flush()
            call_id = require_str(block.get("tool_use_id"), f"{at}.tool_use_id")
            content = _tool_result_content(block.get("content"), at)
            out.append(tool_message(call_id, content, call_names))
        else:
            raise invalid(f"{at}: {kind!r} blocks are not supported in a user message")
    flush()
    return out


def _tool_result_content(content: Any, where: str) -> str | list[dict[str, Any]]:
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise invalid(f"{where}.content: expected a string or a list of blocks")
    parts = []
    for j, block in enumerate(content):
        at = f"{where}.content[{j}]"
        is_image = isinstance(block, dict) and block.get("type") == "image"
        parts.append(_image_part(block, at) if is_image else _text_part(block, at))
    return chat_content(parts)


def _assistant_message(blocks: list[Any], where: str, call_names: dict[str, str]) -> dict[str, Any]:
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(require_str(block.get("text"), f"{at}.text"))
        elif kind == "thinking":
            thinking.append(require_str(block.get("thinking"), f"{at}.thinking"))
        elif kind == "tool_use":
            call_id = require_str(block.get("id"), f"{at}.id")
            name = require_str(block.get("name"), f"{at}.name")
            if not isinstance(block.get("input"), dict):
                raise invalid(f"{at}.input: expected an object")
            call_names[call_id] = name
            calls.append(chat_call(call_id, name, json.dumps(block["input"], ensure_ascii=False)))
        else:
            raise invalid(f"{at}: {kind!r} blocks are not supported in an assistant message")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if thinking:
        message["reasoning_content"] = "".join(thinking)
    if calls:
        message["tool_calls"] = calls
    return message


def _chat_tool_choice(choice: dict[str, Any] | None) -> str | dict[str, Any] | None:
    if choice is None:
        return None
    kind = choice.get("type")
    if kind in ("auto", "none"):
        return str(kind)
    if kind == "any":
        return "required"
    if kind == "tool":
        name = require_str(choice.get("name"), "tool_choice.name")
        return {"type": "function", "function": {"name": name}}
    raise invalid(f"tool_choice.type: {kind!r} is not supported (auto, any, tool, none)")


# --- the answer -------------------------------------------------------------------------

_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def content_blocks(choice: ChatChoice) -> list[dict[str, Any]]:
    """The answer's ``content``: thinking, text, then one ``tool_use`` per call."""
    blocks: list[dict[str, Any]] = []
    if choice.reasoning is not None:
        blocks.append({"type": "thinking", "thinking": choice.reasoning, "signature": ""})
    if choice.content or not choice.tool_calls:
        blocks.append({"type": "text", "text": choice.content})
    for call in choice.tool_calls:
        arguments = json.loads(call.arguments)
        blocks.append({"type": "tool_use", "id": call.id, "name": call.name, "input": arguments})
    return blocks


def _usage(prompt: int, cached: int = 0, output: int = 0) -> dict[str, Any]:
    return {
        "input_tokens": prompt - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": output,
    }


def _message(
    message_id: str, model: str, content: list[Any], stop: str | None, usage: dict[str, Any]
) -> dict[str, Any]:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": usage,
    }


def message_object(
    result: ChatResult, request: MessagesRequest, *, message_id: str
) -> dict[str, Any]:
    """The ``message`` object of a finished turn."""
    choice = result.choices[0]
    blocks, stop = content_blocks(choice), _STOP_REASONS[choice.finish_reason]
    usage = _usage(result.prompt_tokens, result.cached_tokens, result.completion_tokens)
    return _message(message_id, result.model or request.model, blocks, stop, usage)


class MessageStreamWriter:
    """The events of a streamed message: ``message_start`` and ``ping``, then per block
    ``content_block_start``, its deltas as they come (``thinking_delta``, ``text_delta``)
    and ``content_block_stop``; once the turn is parsed, one ``tool_use`` block per call
    (its input in one ``input_json_delta``), ``message_delta`` (stop reason, usage) and
    ``message_stop``. An error after the start is an ``error`` event."""

    def __init__(self, request: MessagesRequest, start: StreamStart, *, message_id: str) -> None:
        self._request = request
        self._start = start
        self._id = message_id
        self._blocks = 0
        self._open: str | None = None
        self._text_seen = False

    def begin(self) -> list[dict[str, Any]]:
        model = self._start.model or self._request.model
        message = _message(self._id, model, [], None, _usage(self._start.prompt_tokens))
        return [{"type": "message_start", "message": message}, {"type": "ping"}]

    def _begin_block(self, block: dict[str, Any]) -> list[dict[str, Any]]:
        events = self._stop_block()
        self._open = str(block["type"])
        events.append(
            {"type": "content_block_start", "index": self._blocks, "content_block": block}
        )
        return events

    def _stop_block(self) -> list[dict[str, Any]]:
        if self._open is None:
            return []
        self._open = None
        self._blocks += 1
        return [{"type": "content_block_stop", "index": self._blocks - 1}]

    def delta(self, delta: StreamDelta) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if delta.kind == "reasoning":
            if self._open != "thinking":
                events += self._begin_block({"type": "thinking", "thinking": "", "signature": ""})
            body = {"type": "thinking_delta", "thinking": delta.text}
        else:
            if self._open != "text":
                events += self._begin_block({"type": "text", "text": ""})
            self._text_seen = True
            body = {"type": "text_delta", "text": delta.text}
        events.append({"type": "content_block_delta", "index": self._blocks, "delta": body})
        return events

    def finish(self, result: ChatResult) -> list[dict[str, Any]]:
        choice = result.choices[0]
        events: list[dict[str, Any]] = []
        if choice.reasoning is not None and self._blocks == 0 and self._open is None:
            events += self._begin_block({"type": "thinking", "thinking": "", "signature": ""})
        if not self._text_seen and (choice.content or not choice.tool_calls):
            events += self._begin_block({"type": "text", "text": ""})
        events += self._stop_block()
        for call in choice.tool_calls:
            block = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
            events += self._begin_block(block)
            partial = json.dumps(json.loads(call.arguments), ensure_ascii=False)
            delta = {"type": "input_json_delta", "partial_json": partial}
            events.append({"type": "content_block_delta", "index": self._blocks, "delta": delta})
            events += self._stop_block()
        stop = {"stop_reason": _STOP_REASONS[choice.finish_reason], "stop_sequence": None}
        usage = _usage(result.prompt_tokens, result.cached_tokens, result.completion_tokens)
        end = {"type": "message_delta", "delta": stop, "usage": usage}
        return [*events, end, {"type": "message_stop"}]

    def error(self, exc: GatewayError) -> list[dict[str, Any]]:
        body, _ = anthropic_error(exc)
        return [body]


# --- errors and the route ---------------------------------------------------------------

_ERROR_TYPES = {
    "invalid_request": ("invalid_request_error", None),
    "context_length_exceeded": ("invalid_request_error", None),
    "overloaded": ("overloaded_error", 529),
    "timeout": ("timeout_error", 504),
    "engine_error": ("api_error", None),
    "tool_choice_unmet": ("api_error", None),
}


def anthropic_error(exc: GatewayError) -> tuple[dict[str, Any], int]:
    """Anthropic's error body and status for a :class:`GatewayError`."""
    kind, status = _ERROR_TYPES[exc.kind]
    body = {"type": "error", "error": {"type": kind, "message": exc.message}}
    return body, status or exc.status


def add_anthropic_routes(app: FastAPI, gateway: Gateway) -> None:
    """Register ``POST /v1/messages`` (streaming and not) and ``/v1/messages/count_tokens``
    on the gateway's ``app``."""
    callers: Callers = app.state.callers

    @app.post("/v1/messages")
    async def create_message(http_request: Request) -> Response:
        try:
            request = parse_messages_request(await read_json(http_request))
            chat = messages_to_chat(
                request, callers.session(http_request), metadata=request_metadata(http_request)
            )
            message_id = f"msg_{uuid.uuid4().hex}"
            return await answer(
                gateway,
                http_request,
                chat,
                stream=request.stream,
                whole=lambda result: message_object(result, request, message_id=message_id),
                writer=lambda start: MessageStreamWriter(request, start, message_id=message_id),
            )
        except GatewayError as exc:
            error, status = anthropic_error(exc)
            return JSONResponse(error, status_code=status)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(http_request: Request) -> Response:
        """The prompt's length as the gateway renders it for a new segment (Claude Code
        asks before it compacts). Nothing is recorded."""
        try:
            request = parse_messages_request(await read_json(http_request), count_only=True)
            count = await gateway.count_tokens(
                messages_to_chat(request, callers.session(http_request))
            )
        except GatewayError as exc:
            error, status = anthropic_error(exc)
            return JSONResponse(error, status_code=status)
        return JSONResponse({"input_tokens": count})
