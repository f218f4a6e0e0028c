"""OpenAI Responses API (``POST /v1/responses``) in front of the gateway's core.

A request's ``instructions`` and ``input`` items become OpenAI chat messages: ``message``
items keep their role, one model turn's ``reasoning``, assistant ``message`` and
``function_call`` items fold into one assistant message (``reasoning_content``,
``content``, ``tool_calls``), and each ``function_call_output`` becomes a ``tool``
message. The answer is a ``response`` object whose ``output`` lists a ``reasoning`` item
(when the family separates reasoning), a ``message`` item (its text) and one
``function_call`` item per parsed call, in that order, which is also the order the items
come back in on the next request, so a harness that replays ``output`` extends its
session instead of starting a new segment.

The gateway keeps no responses: ``previous_response_id``, ``conversation`` and
``item_reference`` items are refused (a harness sends its whole input, as with
``store=false``), and so are hosted tools, which the gateway cannot run.
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.responses import Response

from ._http import complete_or_abort, openai_error_body, request_metadata, session_key
from ._parts import chat_content, invalid, require_str
from ._sse import sse_response
from ._types import ChatChoice, ChatRequest, ChatResult, GatewayError

if TYPE_CHECKING:
    from ._core import Gateway

__all__ = [
    "ResponsesRequest",
    "add_responses_routes",
    "parse_responses_request",
    "response_events",
    "response_object",
    "responses_error",
    "responses_to_chat",
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


def parse_responses_request(body: Any) -> ResponsesRequest:
    """Validate a request body; a 400 :class:`GatewayError` with one readable line."""
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    try:
        request = ResponsesRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise invalid(f"{where}: {first['msg']}") from None
    if request.previous_response_id is not None or request.conversation is not None:
        raise invalid(
            "previous_response_id and conversation are not supported: the gateway stores no "
            "responses; send the whole conversation as input"
        )
    return request


def responses_to_chat(
    request: ResponsesRequest, session: str, *, metadata: dict[str, Any] | None = None
) -> ChatRequest:
    """The canonical request of a validated Responses request (``metadata``: the
    per-request options of the HTTP layer, such as the GRPO group)."""
    return ChatRequest(
        session=session,
        messages=tuple(responses_messages(request.instructions, request.input)),
        tools=tuple(_chat_tool(tool, i) for i, tool in enumerate(request.tools)),
        tool_choice=_chat_tool_choice(request.tool_choice),
        max_tokens=request.max_output_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        model=request.model,
        metadata={**(metadata or {}), "api": "responses"},
    )


def responses_messages(
    instructions: str | None, items: str | list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """OpenAI chat messages of ``instructions`` and the ``input`` items."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    turn: dict[str, Any] | None = None  # the assistant message being assembled
    call_names: dict[str, str] = {}

    def close() -> None:
        nonlocal turn
        if turn is not None:
            messages.append(turn)
            turn = None

    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role == "assistant":
                if turn is not None and (turn["content"] or "tool_calls" in turn):
                    close()
                turn = turn or {"role": "assistant", "content": ""}
                turn["content"] = _assistant_text(item.get("content"), where)
            elif role in ("user", "system", "developer"):
                close()
                parts = _input_parts(item.get("content"), where)
                messages.append({"role": role, "content": chat_content(parts)})
            else:
                raise invalid(f"{where}.role: expected user, assistant, system or developer")
        elif kind == "reasoning":
            if turn is not None:
                close()
            turn = {"role": "assistant", "content": "", "reasoning_content": _reasoning(item)}
        elif kind == "function_call":
            turn = turn or {"role": "assistant", "content": ""}
            call_id = require_str(item.get("call_id"), f"{where}.call_id")
            name = require_str(item.get("name"), f"{where}.name")
            call_names[call_id] = name
            turn.setdefault("tool_calls", []).append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {
                        "name": name,
                        "arguments": require_str(item.get("arguments"), f"{where}.arguments"),
                    },
                }
            )
        elif kind == "function_call_output":
            close()
            call_id = require_str(item.get("call_id"), f"{where}.call_id")
            message = {"role": "tool", "tool_call_id": call_id, "content": _output(item, where)}
            if call_id in call_names:
                message["name"] = call_names[call_id]
            messages.append(message)
        elif kind == "item_reference":
            raise invalid(f"{where}: item_reference needs stored items; send the item itself")
        else:
            raise invalid(f"{where}.type: {kind!r} items are not supported (function tools only)")
    close()
    return messages


def _input_parts(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise invalid(f"{where}.content: expected a string or a list of parts")
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text"):
            parts.append({"type": "text", "text": require_str(part["text"], f"{where}.text")})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        else:
            raise invalid(
                f"{where}.content[{j}]: {kind!r} parts are not supported "
                "(input_text, and input_image with an image_url)"
            )
    return parts


def _assistant_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(f"{where}.content: expected a string or a list of parts")
    texts: list[str] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("output_text", "input_text"):
            texts.append(require_str(part["text"], f"{where}.content[{j}].text"))
        elif kind == "refusal":
            texts.append(require_str(part["refusal"], f"{where}.content[{j}].refusal"))
        else:
            raise invalid(f"{where}.content[{j}]: {kind!r} parts are not supported here")
    return "".join(texts)


def _reasoning(item: dict[str, Any]) -> str:
    """The reasoning text of a ``reasoning`` item: its content, else its summary."""
    content = item.get("content") or item.get("summary") or []
    return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))


def _output(item: dict[str, Any], where: str) -> str | list[dict[str, Any]]:
    output = item.get("output")
    if isinstance(output, str):
        return output
    return chat_content(_input_parts(output, f"{where}.output"))


def _chat_tool(tool: dict[str, Any], i: int) -> dict[str, Any]:
    if tool.get("type") != "function":
        raise invalid(
            f"tools[{i}]: {tool.get('type')!r} tools are not supported; the gateway serves "
            "function tools, which the harness runs"
        )
    function: dict[str, Any] = {"name": require_str(tool.get("name"), f"tools[{i}].name")}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    function["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = require_str(choice.get("name"), "tool_choice.name")
        return {"type": "function", "function": {"name": name}}
    raise invalid(f"tool_choice: {choice!r} is not supported (auto, none, required, a function)")


# --- the answer -------------------------------------------------------------------------


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def output_items(choice: ChatChoice) -> list[dict[str, Any]]:
    """The ``output`` of one choice: reasoning, message, then one item per call."""
    status = "incomplete" if choice.finish_reason == "length" else "completed"
    items: list[dict[str, Any]] = []
    if choice.reasoning is not None:
        items.append(
            {
                "id": _new_id("rs"),
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": choice.reasoning}],
                "status": status,
            }
        )
    if choice.content or not choice.tool_calls:
        items.append(
            {
                "id": _new_id("msg"),
                "type": "message",
                "role": "assistant",
                "status": status,
                "content": [
                    {
                        "type": "output_text",
                        "text": choice.content,
                        "annotations": [],
                        "logprobs": [],
                    }
                ],
            }
        )
    items.extend(
        {
            "id": _new_id("fc"),
            "type": "function_call",
            "call_id": call.id,
            "name": call.name,
            "arguments": call.arguments,
            "status": status,
        }
        for call in choice.tool_calls
    )
    return items


def response_object(
    result: ChatResult,
    request: ResponsesRequest,
    *,
    response_id: str,
    output: list[dict[str, Any]],
    status: str | None = None,
) -> dict[str, Any]:
    """The ``response`` object; ``status`` None: completed, or incomplete at the token cap."""
    truncated = result.choices[0].finish_reason == "length"
    status = status or ("incomplete" if truncated else "completed")
    done = status in ("completed", "incomplete")
    return {
        "id": response_id,
        "object": "response",
        "created_at": result.created,
        "status": status,
        "error": None,
        "incomplete_details": (
            {"reason": "max_output_tokens"} if truncated and status == "incomplete" else None
        ),
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "model": result.model or request.model,
        "output": output,
        "parallel_tool_calls": request.parallel_tool_calls,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "store": False,
        "temperature": request.temperature,
        "text": {"format": {"type": "text"}},
        "tool_choice": request.tool_choice if request.tool_choice is not None else "auto",
        "tools": request.tools,
        "top_p": request.top_p,
        "truncation": "disabled",
        "usage": _usage(result) if done else None,
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


def response_events(
    result: ChatResult, request: ResponsesRequest, *, response_id: str
) -> list[dict[str, Any]]:
    """The stream of one finished turn, in the order OpenAI documents and the SDK checks:
    ``response.created``, ``response.in_progress``, per item ``output_item.added``, its
    deltas and ``.done`` events, ``output_item.done``, and ``response.completed`` (or
    ``response.incomplete`` at the token cap)."""
    final = response_object(
        result, request, response_id=response_id, output=output_items(result.choices[0])
    )
    events: list[dict[str, Any]] = []

    def emit(kind: str, **fields: Any) -> None:
        events.append({"type": kind, "sequence_number": len(events), **fields})

    for kind in ("response.created", "response.in_progress"):
        emit(kind, response=dict(final, status="in_progress", output=[], usage=None))
    for index, item in enumerate(final["output"]):
        emit("response.output_item.added", output_index=index, item=_started(item))
        where = {"item_id": item["id"], "output_index": index}
        if item["type"] == "message":
            part = item["content"][0]
            emit(
                "response.content_part.added",
                **where,
                content_index=0,
                part=dict(part, text=""),
            )
            emit(
                "response.output_text.delta",
                **where,
                content_index=0,
                delta=part["text"],
                logprobs=[],
            )
            emit(
                "response.output_text.done",
                **where,
                content_index=0,
                text=part["text"],
                logprobs=[],
            )
            emit("response.content_part.done", **where, content_index=0, part=part)
        elif item["type"] == "function_call":
            emit("response.function_call_arguments.delta", **where, delta=item["arguments"])
            emit(
                "response.function_call_arguments.done",
                **where,
                name=item["name"],
                arguments=item["arguments"],
            )
        elif item["type"] == "reasoning":
            part = item["content"][0]
            emit("response.content_part.added", **where, content_index=0, part=dict(part, text=""))
            emit("response.reasoning_text.delta", **where, content_index=0, delta=part["text"])
            emit("response.reasoning_text.done", **where, content_index=0, text=part["text"])
            emit("response.content_part.done", **where, content_index=0, part=part)
        emit("response.output_item.done", output_index=index, item=item)
    emit(f"response.{final['status']}", response=final)
    return events


def _started(item: dict[str, Any]) -> dict[str, Any]:
    """An item as ``output_item.added`` announces it: in progress, before its deltas."""
    if item["type"] == "message":
        return dict(item, status="in_progress", content=[])
    if item["type"] == "function_call":
        return dict(item, status="in_progress", arguments="")
    return dict(item, status="in_progress", content=[])


# --- errors and the route ---------------------------------------------------------------


def responses_error(exc: GatewayError) -> JSONResponse:
    """OpenAI's error envelope and status (the input is the parameter a context overflow
    names; an overload asks the SDK to retry after a second)."""
    param = "input" if exc.kind == "context_length_exceeded" else None
    headers = {"retry-after": "1"} if exc.kind == "overloaded" else None
    body = openai_error_body(exc, param=param)
    return JSONResponse(body, status_code=exc.status, headers=headers)


def add_responses_routes(app: FastAPI, gateway: Gateway) -> None:
    """Register ``POST /v1/responses`` (streaming and not) on the gateway's ``app``."""

    @app.post("/v1/responses")
    async def create_response(http_request: Request) -> Response:
        try:
            try:
                body = json.loads(await http_request.body() or b"null")
            except ValueError as exc:
                raise invalid(f"the request body is not JSON: {exc}") from None
            request = parse_responses_request(body)
            chat = responses_to_chat(
                request, session_key(http_request), metadata=request_metadata(http_request)
            )
            result = await complete_or_abort(gateway, http_request, chat)
        except GatewayError as exc:
            return responses_error(exc)
        response_id = _new_id("resp")
        if request.stream:
            return sse_response(response_events(result, request, response_id=response_id))
        output = output_items(result.choices[0])
        return JSONResponse(
            response_object(result, request, response_id=response_id, output=output)
        )
