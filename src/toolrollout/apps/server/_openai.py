"""OpenAI-compatible ``POST /v1/chat/completions`` with tool-call parsing.

Peer libraries that speak only OpenAI's chat API (``verifiers``' ToolEnv, agent
frameworks) need this route; its shapes follow SGLang's ``serving_chat.py`` (docs/engines.md
describes them). The benchmark's latency-model server adds the same route
(:func:`add_chat_completions`).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Sequence
from http import HTTPStatus
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from toolrollout._exceptions import ToolRolloutError, UserError
from toolrollout.chat import ChatFormat, ToolCall
from toolrollout.chat.parsers import get_tool_parser
from toolrollout.engines._types import GenerateRequest, GenerateResult, SamplingParams

__all__ = ["ChatCompletionRequest", "add_chat_completions", "validate_body"]

_Model = TypeVar("_Model", bound=BaseModel)


class ChatCompletionRequest(BaseModel):
    """The fields of an OpenAI chat request this server honours (others are ignored)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = -1
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    logprobs: bool = False
    rid: str | None = None

    @property
    def max_new_tokens(self) -> int:
        return self.max_completion_tokens or self.max_tokens or 128

    def sampling(self) -> SamplingParams:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return SamplingParams(
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            stop=stop,
            seed=self.seed,
        )

    def tools_enabled(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"


def validate_body(
    model: type[_Model], body: Any, error: Callable[[str], Exception] = UserError
) -> _Model:
    """``body`` validated as ``model``; ``error`` with one readable line when it is not."""
    if not isinstance(body, dict):
        raise error("the request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise error(f"{where}: {first['msg']}") from None


def _completion(
    result: GenerateResult, model: str, rid: str, content: str | None, calls: Sequence[ToolCall]
) -> dict[str, Any]:
    """A ``chat.completion`` object in SGLang's layout: a stop that produced tool calls
    reports ``"tool_calls"``, each with a fresh ``call_<24 hex>`` id."""
    tool_calls = [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "index": i,
            "type": "function",
            "function": {
                "name": call.name,
                "arguments": json.dumps(call.arguments, ensure_ascii=False),
            },
        }
        for i, call in enumerate(calls)
    ]
    finish = result.finish_reason
    message = {
        "role": "assistant",
        "content": content if content else None,
        "reasoning_content": None,
        "tool_calls": tool_calls or None,
    }
    usage: dict[str, Any] = {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "total_tokens": result.prompt_tokens + result.completion_tokens,
        "reasoning_tokens": 0,
    }
    if result.cached_tokens:
        usage["prompt_tokens_details"] = {"cached_tokens": result.cached_tokens}
    choice = {
        "index": 0,
        "message": message,
        "logprobs": None,
        "finish_reason": "tool_calls" if finish.type == "stop" and calls else finish.type,
        "matched_stop": None if calls else finish.matched,
    }
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage,
    }


def add_chat_completions(
    app: FastAPI,
    *,
    tokenizer: Any,
    generate: Callable[[GenerateRequest], Any],
    model_name: str,
    tool_parser: str | None = None,
) -> None:
    """Register ``POST /v1/chat/completions`` on a FastAPI ``app``.

    ``generate`` is the engine's coroutine function (token-in/token-out); the route renders
    the chat template on the server side, as SGLang does, and parses tool calls with
    ``tool_parser`` (SGLang's ``--tool-call-parser``; None: the model family's parser).
    """
    # Imported here: _answers loads the embedded engine, which the gateway (importing this
    # module for its request model) does not need.
    from toolrollout.apps.server._answers import error_response, json_response

    if tool_parser:
        get_tool_parser(tool_parser)  # an unknown name fails at startup, not per request
    formats: dict[str, ChatFormat] = {}

    def chat_format(tools: list[dict[str, Any]] | None) -> ChatFormat:
        key = json.dumps(tools or [], sort_keys=True)
        found = formats.get(key)
        if found is None:
            found = ChatFormat(tokenizer, tools=tools or None)
            if len(formats) < 64:
                formats[key] = found
        return found

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        try:
            body = json.loads(await request.body() or b"{}")
            parsed = validate_body(ChatCompletionRequest, body)
            if parsed.stream:
                raise UserError("stream=true is not supported by this server; use stream=false")
            if parsed.n != 1:
                raise UserError(f"n={parsed.n} is not supported by this server; send n=1")
            fmt = chat_format(parsed.tools if parsed.tools_enabled() else None)
            prompt_ids = fmt.render_prompt(parsed.messages)
        except ValueError as exc:  # JSON errors
            return error_response(f"JSON decode error: {exc}", HTTPStatus.BAD_REQUEST)
        except ToolRolloutError as exc:
            return error_response(str(exc), HTTPStatus.BAD_REQUEST)
        rid = parsed.rid or f"chatcmpl-{uuid.uuid4().hex}"
        try:
            result = await generate(
                GenerateRequest(input_ids=tuple(prompt_ids), sampling=parsed.sampling(), rid=rid)
            )
        except UserError as exc:
            return error_response(str(exc), HTTPStatus.BAD_REQUEST)
        except ToolRolloutError as exc:
            return error_response(str(exc), HTTPStatus.SERVICE_UNAVAILABLE)
        content: str | None = fmt.model_text(result.output_ids)
        calls: Sequence[ToolCall] = ()
        if parsed.tools_enabled():
            # Built per request: schema-typed formats (qwen3_coder) read this request's tools.
            parser = get_tool_parser(tool_parser or fmt.family.tool_parser, tools=fmt.tools)
            turn = parser.parse(content or "")
            if turn.tool_calls:
                calls, content = turn.tool_calls, turn.content
        return json_response(_completion(result, parsed.model or model_name, rid, content, calls))
