"""OpenAI Responses API (``POST /v1/responses``) in front of the gateway's core.

A request's ``instructions`` and ``input`` items become OpenAI chat messages; the answer is
built in ``_responses_output.py``; stored responses live in a bounded
:class:`ResponseStore`. See docs/gateway.md for what is refused and how
``previous_response_id`` extends a segment.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.responses import Response

from toolrollout.apps.server._openai import validate_body

from ._http import Callers, answer, openai_error, read_json, request_metadata
from ._parts import chat_call, chat_content, function_tools, require_str, tool_message
from ._responses_output import (
    ResponsesRequest,
    ResponseStreamWriter,
    new_id,
    output_items,
    response_object,
)
from ._types import ChatRequest, ChatResult, GatewayError, StreamStart, invalid

if TYPE_CHECKING:
    from ._core import Gateway

__all__ = [
    "ResponseStore",
    "StoredResponse",
    "add_responses_routes",
    "parse_responses_request",
    "responses_to_chat",
]


def parse_responses_request(body: Any) -> ResponsesRequest:
    """Validate a request body; a 400 :class:`GatewayError` with one readable line."""
    request = validate_body(ResponsesRequest, body, invalid)
    if request.conversation is not None:
        raise invalid(
            "conversation is not supported: the gateway has no Conversations API; use "
            "previous_response_id or send the whole conversation as input"
        )
    return request


def responses_to_chat(
    request: ResponsesRequest,
    session: str,
    *,
    metadata: dict[str, Any] | None = None,
    items: list[dict[str, Any]] | None = None,
) -> ChatRequest:
    """The canonical request of a validated Responses request (``metadata``: the
    per-request options of the HTTP layer, such as the GRPO group; ``items``: the whole
    input when a stored response's conversation goes before ``request.input``)."""
    items = _input_items(request) if items is None else items
    return ChatRequest(
        session=session,
        messages=tuple(responses_messages(request.instructions, items)),
        tools=function_tools(request.tools, kinds=("function",), schema="parameters"),
        tool_choice=_chat_tool_choice(request.tool_choice),
        max_tokens=request.max_output_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        model=request.model,
        metadata={**(metadata or {}), "api": "responses"},
    )


def responses_messages(
    instructions: str | None, items: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """OpenAI chat messages of ``instructions`` and the ``input`` items."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
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
            arguments = require_str(item.get("arguments"), f"{where}.arguments")
            turn.setdefault("tool_calls", []).append(chat_call(call_id, name, arguments))
        elif kind == "function_call_output":
            close()
            call_id = require_str(item.get("call_id"), f"{where}.call_id")
            messages.append(tool_message(call_id, _output(item, where), call_names))
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


def _chat_tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = require_str(choice.get("name"), "tool_choice.name")
        return {"type": "function", "function": {"name": name}}
    raise invalid(f"tool_choice: {choice!r} is not supported (auto, none, required, a function)")


# --- errors and the route ---------------------------------------------------------------


@dataclass(frozen=True)
class StoredResponse:
    """A stored response: the whole conversation up to it, as Responses input items (the
    inputs of its chain and every output), and the ``response`` object ``GET`` returns."""

    items: tuple[dict[str, Any], ...]
    response: dict[str, Any]
    session: str
    """The session that made it: only its requests (or the admin key) may read it."""


class ResponseStore:
    """Stored responses (``store: true``), at most ``capacity``; the least recently used
    one is dropped to make room, and ``previous_response_id`` naming it is then a 404.

    One entry holds references to the item dicts of its chain (shared with the entries
    before it, not copied), so memory grows with the conversations, bounded by the cap.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def get(self, response_id: str) -> StoredResponse | None:
        found = self._entries.get(response_id)
        if found is not None:
            self._entries.move_to_end(response_id)
        return found

    def put(self, response_id: str, stored: StoredResponse) -> None:
        self._entries[response_id] = stored
        self._entries.move_to_end(response_id)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def delete(self, response_id: str) -> bool:
        return self._entries.pop(response_id, None) is not None


def _input_items(request: ResponsesRequest) -> list[dict[str, Any]]:
    if isinstance(request.input, str):
        return [{"type": "message", "role": "user", "content": request.input}]
    return list(request.input)


def _not_found(response_id: str, *, param: str | None) -> JSONResponse:
    body = {
        "error": {
            "message": f"Response with id '{response_id}' not found (never stored, deleted, "
            "or dropped from the gateway's store of the newest --max-stored-responses).",
            "type": "invalid_request_error",
            "param": param,
            "code": "previous_response_not_found" if param else None,
        }
    }
    return JSONResponse(body, status_code=404)


def add_responses_routes(app: FastAPI, gateway: Gateway) -> None:
    """Register ``POST /v1/responses`` (streaming and not), ``GET`` and ``DELETE
    /v1/responses/{id}`` on the gateway's ``app``, with a store of responses."""
    store = ResponseStore(gateway.config.max_stored_responses)
    app.state.responses = store
    callers: Callers = app.state.callers

    def visible(request: Request, response_id: str) -> StoredResponse | None:
        """The stored response, if this request's session made it (or it is the admin's);
        another session's is as unknown as a missing one."""
        found = store.get(response_id)
        if found is None or not callers.may_see(request, found.session):
            return None
        return found

    @app.post("/v1/responses")
    async def create_response(http_request: Request) -> Response:
        try:
            request = parse_responses_request(await read_json(http_request))
            items = _input_items(request)
            if request.previous_response_id is not None:
                previous = visible(http_request, request.previous_response_id)
                if previous is None:
                    return _not_found(request.previous_response_id, param="previous_response_id")
                items = [*previous.items, *items]
            keep = request.store is not False
            session = callers.session(http_request)
            chat = responses_to_chat(
                request,
                session,
                metadata=request_metadata(http_request),
                items=items,
            )
            response_id = new_id("resp")

            def remember(final: dict[str, Any]) -> dict[str, Any]:
                if keep:
                    stored = StoredResponse((*items, *final["output"]), final, session)
                    store.put(response_id, stored)
                return final

            def whole(result: ChatResult) -> dict[str, Any]:
                output = output_items(result.choices[0])
                return remember(
                    response_object(
                        result, request, response_id=response_id, output=output, store=keep
                    )
                )

            def writer(start: StreamStart) -> ResponseStreamWriter:
                return ResponseStreamWriter(
                    request,
                    response_id=response_id,
                    created=start.created,
                    model=start.model,
                    store=keep,
                    on_final=remember,
                )

            return await answer(
                gateway, http_request, chat, stream=request.stream, whole=whole, writer=writer
            )
        except GatewayError as exc:
            return openai_error(exc, context_param="input")

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str, http_request: Request) -> Response:
        found = visible(http_request, response_id)
        if found is None:
            return _not_found(response_id, param=None)
        return JSONResponse(found.response)

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str, http_request: Request) -> Response:
        if visible(http_request, response_id) is None or not store.delete(response_id):
            return _not_found(response_id, param=None)
        return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})
