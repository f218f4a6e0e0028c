"""The Messages API translation, checked against the official ``anthropic`` SDK.

Answers are validated strictly by the SDK's pydantic models, the stream is rebuilt with the
SDK's own ``accumulate_event`` (what ``messages.stream()`` runs) and must equal the
non-streamed message, and ``Message.to_param()`` (how a harness appends the answer) must
fold back into the assistant message the core recorded.
"""

from __future__ import annotations

import typing
from typing import Any

import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import BaseModel

from toolrollout.apps.gateway import ChatResult, GatewayError
from toolrollout.apps.gateway._anthropic import (
    MessageStreamWriter,
    anthropic_error,
    anthropic_messages,
    message_object,
    messages_to_chat,
    parse_messages_request,
)
from toolrollout.apps.gateway._types import ChatChoice, StreamStart, ToolCallOut

from ._turn import turn_events

CALC = {
    "name": "calculator",
    "description": "Evaluate an arithmetic expression.",
    "input_schema": {
        "type": "object",
        "properties": {"expression": {"type": "string"}},
        "required": ["expression"],
    },
}
CALL = ToolCallOut("call_abc", "calculator", '{"expression": "2 + 3"}')
CALL2 = ToolCallOut("call_def", "calculator", '{"expression": "7 × 6"}')


def choice(
    content: str = "",
    calls: tuple[ToolCallOut, ...] = (),
    reasoning: str | None = None,
    finish: Any = None,
) -> ChatChoice:
    return ChatChoice(0, content, reasoning, calls, finish or ("tool_calls" if calls else "stop"))


CHOICES = [
    choice("The answer is 5."),
    choice("", (CALL,)),
    choice("Let me compute.", (CALL, CALL2)),
    choice("5", reasoning="2 + 3 is 5"),
    choice("The answer is", finish="length"),
    choice(""),
]


def result(c: ChatChoice) -> ChatResult:
    return ChatResult("x", "demo", 1_700_000_000, (c,), prompt_tokens=40,
                      completion_tokens=12, cached_tokens=8)  # fmt: skip


def request(**fields: Any) -> Any:
    body = {"model": "demo", "max_tokens": 64, "messages": [{"role": "user", "content": "Hi"}]}
    return parse_messages_request(body | fields)


def canonical(c: ChatChoice) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": c.content}
    if c.reasoning is not None:
        message["reasoning_content"] = c.reasoning
    if c.tool_calls:
        message["tool_calls"] = [
            {"id": t.id, "type": "function", "function": {"name": t.name, "arguments": t.arguments}}
            for t in c.tool_calls
        ]
    return message


def _event_types() -> dict[str, type[BaseModel]]:
    union = typing.get_args(RawMessageStreamEvent)[0]
    return {
        typing.get_args(cls.model_fields["type"].annotation)[0]: cls
        for cls in typing.get_args(union)
    }


EVENT_TYPES = _event_types()


@pytest.mark.parametrize("c", CHOICES)
def test_the_message_is_valid_for_the_sdk(c: ChatChoice) -> None:
    message = Message.model_validate(message_object(result(c), request(), message_id="msg_1"))
    expected = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
    assert message.stop_reason == expected[c.finish_reason]
    assert [b.type for b in message.content] == (
        (["thinking"] if c.reasoning is not None else [])
        + (["text"] if c.content or not c.tool_calls else [])
        + ["tool_use"] * len(c.tool_calls)
    )
    uses = [b for b in message.content if b.type == "tool_use"]
    assert [(b.id, b.name) for b in uses] == [(t.id, t.name) for t in c.tool_calls]
    assert message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) == 40
    assert message.usage.output_tokens == 12


@pytest.mark.parametrize("c", CHOICES)
def test_the_stream_accumulates_to_the_same_message(c: ChatChoice) -> None:
    res = result(c)
    start = StreamStart("msg_1", res.model, res.created, res.prompt_tokens)
    events = turn_events(MessageStreamWriter(request(stream=True), start, message_id="msg_1"), res)
    snapshot = None
    json_bufs: dict[int, bytes] = {}
    for raw in events:
        if raw["type"] == "ping":  # the SDK skips pings before parsing
            continue
        event: Any = EVENT_TYPES[raw["type"]].model_validate(raw)
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=json_bufs)
    assert [e["type"] for e in events[:2]] == ["message_start", "ping"]
    assert [e["type"] for e in events[-2:]] == ["message_delta", "message_stop"]
    assert snapshot is not None
    whole = message_object(result(c), request(), message_id="msg_1")
    assert snapshot.model_dump(exclude_none=True) == Message.model_validate(whole).model_dump(
        exclude_none=True
    )


@pytest.mark.parametrize("c", [c for c in CHOICES if c.content or c.tool_calls])
def test_the_answer_appended_by_to_param_folds_back(c: ChatChoice) -> None:
    message = Message.model_validate(message_object(result(c), request(), message_id="msg_1"))
    param = message.to_param()
    conversation: list[dict[str, Any]] = [
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": [b.model_dump() for b in param["content"]]},  # type: ignore[union-attr]
    ]
    if c.tool_calls:
        results: list[dict[str, Any]] = [
            {"type": "tool_result", "tool_use_id": t.id, "content": "5"} for t in c.tool_calls
        ]
        conversation.append(
            {"role": "user", "content": [*results, {"type": "text", "text": "ok?"}]}
        )
    messages = anthropic_messages("Be brief.", conversation)
    assert messages[:2] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 3?"},
    ]
    assert messages[2] == canonical(c)
    if c.tool_calls:
        assert messages[3:] == [
            *({"role": "tool", "tool_call_id": t.id, "name": t.name, "content": "5"}
              for t in c.tool_calls),
            {"role": "user", "content": "ok?"},
        ]  # fmt: skip


def test_request_fields_reach_the_canonical_request() -> None:
    req = request(
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        tools=[CALC],
        tool_choice={"type": "any"},
        stop_sequences=["END"],
        temperature=0.5,
        top_p=0.9,
        top_k=20,
        metadata={"user_id": "u1"},
    )
    chat = messages_to_chat(req, "s1")
    assert chat.session == "s1" and chat.model == "demo"
    assert chat.messages == (
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    )
    assert chat.tools == (
        {
            "type": "function",
            "function": {
                "name": "calculator",
                "description": CALC["description"],
                "parameters": CALC["input_schema"],
            },
        },
    )
    assert chat.tool_choice == "required"
    assert (chat.max_tokens, chat.stop, chat.temperature, chat.top_p, chat.top_k) == (
        64, ("END",), 0.5, 0.9, 20,
    )  # fmt: skip
    named = messages_to_chat(request(tool_choice={"type": "tool", "name": "calculator"}), "s")
    assert named.tool_choice == {"type": "function", "function": {"name": "calculator"}}


def test_tool_results_with_blocks_and_images() -> None:
    [_, tool, user] = anthropic_messages(
        None,
        [
            {"role": "user", "content": "Look"},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                        "is_error": True,
                    },
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"},
                    },
                ],
            },
        ],
    )
    assert tool == {
        "role": "tool",
        "tool_call_id": "t1",
        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
    }
    assert user == {
        "role": "user",
        "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}],
    }


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"messages": []}, "messages"),
        ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "tools[0]"),
        ({"tool_choice": {"type": "whatever"}}, "tool_choice"),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
        (
            {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
            "messages[0].content[0]",
        ),
        (
            {"messages": [{"role": "assistant", "content": [{"type": "redacted_thinking"}]}]},
            "redacted_thinking",
        ),
    ],
)
def test_untranslatable_requests_are_refused_with_the_field(
    fields: dict[str, Any], needle: str
) -> None:
    with pytest.raises(GatewayError) as info:
        messages_to_chat(request(**fields), "s")
    assert info.value.kind == "invalid_request" and info.value.status == 400
    assert needle in info.value.message


@pytest.mark.parametrize(
    ("kind", "status", "api_type", "api_status"),
    [
        ("invalid_request", 400, "invalid_request_error", 400),
        ("context_length_exceeded", 400, "invalid_request_error", 400),
        ("overloaded", 429, "overloaded_error", 529),
        ("timeout", 504, "timeout_error", 504),
        ("engine_error", 502, "api_error", 502),
    ],
)
def test_errors_use_anthropics_envelope(
    kind: Any, status: int, api_type: str, api_status: int
) -> None:
    body, code = anthropic_error(GatewayError(kind, "why", status=status))
    assert body == {"type": "error", "error": {"type": api_type, "message": "why"}}
    assert code == api_status
