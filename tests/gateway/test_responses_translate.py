"""The Responses API translation, checked against the official SDK's own types and helpers.

The answers are validated by the ``openai`` SDK's pydantic models (strictly, not with the
lenient ``construct`` the client uses), the stream is replayed through the SDK's
``ResponseStreamState`` accumulator, and the input conversion is compared with
openai-agents' Responses-to-chat converter, an implementation written by others.
"""

from __future__ import annotations

import json
import typing
from typing import Any

import pytest
from openai import omit
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import BaseModel

from toolrollout.apps.gateway import ChatResult, GatewayError
from toolrollout.apps.gateway._http import openai_error
from toolrollout.apps.gateway._responses import (
    parse_responses_request,
    responses_messages,
    responses_to_chat,
)
from toolrollout.apps.gateway._responses_output import (
    ResponseStreamWriter,
    output_items,
    response_object,
)
from toolrollout.apps.gateway._types import ChatChoice, ToolCallOut

from ._turn import turn_events

CALC = {
    "type": "function",
    "name": "calculator",
    "description": "Evaluate an arithmetic expression.",
    "parameters": {
        "type": "object",
        "properties": {"expression": {"type": "string"}},
        "required": ["expression"],
    },
    "strict": False,
}


def result(choice: ChatChoice) -> ChatResult:
    return ChatResult(
        id="x", model="demo", created=1_700_000_000, choices=(choice,),
        prompt_tokens=40, completion_tokens=12, cached_tokens=8,
    )  # fmt: skip


def choice(
    content: str = "",
    calls: tuple[ToolCallOut, ...] = (),
    reasoning: str | None = None,
    finish: Any = None,
) -> ChatChoice:
    finish = finish or ("tool_calls" if calls else "stop")
    return ChatChoice(0, content, reasoning, calls, finish)


CALL = ToolCallOut("call_abc", "calculator", '{"expression": "2 + 3"}')
CALL2 = ToolCallOut("call_def", "calculator", '{"expression": "7 * 6"}')
CHOICES = [
    choice("The answer is 5."),
    choice("", (CALL,)),
    choice("Let me compute.", (CALL, CALL2)),
    choice("5", reasoning="2 + 3 is 5"),
    choice("The answer is", finish="length"),
]


def canonical(c: ChatChoice) -> dict[str, Any]:
    """The assistant message the core records for a choice."""
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
    """The SDK's stream event classes by their ``type`` literal."""
    union = typing.get_args(ResponseStreamEvent)[0]
    found = {}
    for cls in typing.get_args(union):
        found[typing.get_args(cls.model_fields["type"].annotation)[0]] = cls
    return found


EVENT_TYPES = _event_types()


def request(**fields: Any) -> Any:
    return parse_responses_request({"model": "demo", "input": "What is 2 + 3?", **fields})


@pytest.mark.parametrize("c", CHOICES)
def test_the_response_object_is_valid_for_the_sdk(c: ChatChoice) -> None:
    req = request(tools=[CALC])
    body = response_object(result(c), req, response_id="resp_1", output=output_items(c))
    parsed = Response.model_validate(body)  # strict: every required field, every literal
    assert parsed.status == ("incomplete" if c.finish_reason == "length" else "completed")
    assert parsed.output_text == c.content
    calls = [item for item in parsed.output if item.type == "function_call"]
    assert [(t.call_id, t.name, t.arguments) for t in calls] == [
        (t.id, t.name, t.arguments) for t in c.tool_calls
    ]
    assert parsed.usage is not None and parsed.usage.input_tokens_details.cached_tokens == 8
    if c.finish_reason == "length":
        assert parsed.incomplete_details is not None
        assert parsed.incomplete_details.reason == "max_output_tokens"


@pytest.mark.parametrize("c", CHOICES)
def test_the_stream_replays_through_the_sdk_accumulator(c: ChatChoice) -> None:
    """Each event validates as the SDK's event type, the SDK's stream state accepts the
    order, and the text and arguments it accumulates equal the final response's."""
    req = request(tools=[CALC], stream=True)
    res = result(c)
    writer = ResponseStreamWriter(req, response_id="resp_1", created=res.created, model=res.model)
    events = turn_events(writer, res)
    state: ResponseStreamState[Any] = ResponseStreamState(
        input_tools=[CALC],  # type: ignore[list-item]
        text_format=omit,
    )
    out = []
    for n, raw in enumerate(events):
        assert raw["sequence_number"] == n
        event: Any = EVENT_TYPES[raw["type"]].model_validate(raw)
        out += state.handle_event(event)
    kinds = [e.type for e in out]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    final = Response.model_validate(events[-1]["response"])
    assert kinds[-1] == f"response.{final.status}"
    texts = [e.snapshot for e in out if e.type == "response.output_text.delta"]
    assert texts[-1:] == (
        [final.output_text] if any(i.type == "message" for i in final.output) else []
    )
    arguments = [e.snapshot for e in out if e.type == "response.function_call_arguments.delta"]
    assert arguments == [i.arguments for i in final.output if i.type == "function_call"]
    added = [e.item.id for e in out if e.type == "response.output_item.added"]
    done = [e.item.id for e in out if e.type == "response.output_item.done"]
    assert added == done == [i.id for i in final.output]
    if final.status == "completed":
        [completed] = [e for e in out if e.type == "response.completed"]
        assert completed.response.output_text == c.content


@pytest.mark.parametrize("c", CHOICES)
def test_replayed_output_folds_back_into_the_recorded_assistant_message(c: ChatChoice) -> None:
    items = output_items(c)
    replay: list[dict[str, Any]] = [{"role": "user", "content": "What is 2 + 3?"}, *items]
    replay += [
        {"type": "function_call_output", "call_id": t.id, "output": "5"} for t in c.tool_calls
    ]
    messages = responses_messages("Be brief.", replay)
    assert messages[0] == {"role": "system", "content": "Be brief."}
    assert messages[1] == {"role": "user", "content": "What is 2 + 3?"}
    assert messages[2] == canonical(c)
    assert messages[3:] == [
        {"role": "tool", "tool_call_id": t.id, "name": t.name, "content": "5"} for t in c.tool_calls
    ]


def test_several_turns_match_openai_agents_converter() -> None:
    """openai-agents' own Responses-items-to-chat converter reads the same conversation."""
    from agents.models.chatcmpl_converter import Converter

    turn1, turn2 = choice("", (CALL, CALL2)), choice("5 and 42.")
    items: list[dict[str, Any]] = [
        {"role": "system", "content": "Use the calculator."},
        {"role": "user", "content": [{"type": "input_text", "text": "2+3 and 7*6?"}]},
        *output_items(turn1),
        {"type": "function_call_output", "call_id": "call_abc", "output": "5"},
        {"type": "function_call_output", "call_id": "call_def", "output": "42"},
        *output_items(turn2),
        {"role": "user", "content": "Thanks"},
    ]
    ours = responses_messages(None, items)
    theirs = Converter.items_to_messages(items)  # type: ignore[arg-type]

    def norm(message: Any) -> dict[str, Any]:
        m: dict[str, Any] = dict(message)
        m.pop("name", None)  # ours names the tool a result answers, for templates that show it
        if isinstance(m.get("content"), list):  # theirs keeps one-part lists
            m["content"] = "".join(p["text"] for p in m["content"])
        if m.get("content") is None:
            m["content"] = ""
        if m.get("tool_calls") == []:
            del m["tool_calls"]
        return m

    assert [norm(m) for m in ours] == [norm(m) for m in theirs]
    assert len(ours) == 7


def test_request_fields_reach_the_canonical_request() -> None:
    req = request(
        instructions="Be brief.",
        tools=[CALC],
        tool_choice={"type": "function", "name": "calculator"},
        max_output_tokens=64,
        temperature=0.5,
        top_p=0.9,
    )
    chat = responses_to_chat(req, "s1")
    assert chat.session == "s1" and chat.model == "demo"
    assert chat.messages == (
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 3?"},
    )
    assert chat.tools == (
        {
            "type": "function",
            "function": {
                "name": "calculator",
                "description": CALC["description"],
                "parameters": CALC["parameters"],
            },
        },
    )
    assert chat.tool_choice == {"type": "function", "function": {"name": "calculator"}}
    assert (chat.max_tokens, chat.temperature, chat.top_p) == (64, 0.5, 0.9)
    assert responses_to_chat(request(tool_choice="required"), "s").tool_choice == "required"


def test_multi_part_and_image_inputs_stay_parts() -> None:
    content = [
        {"type": "input_text", "text": "Look:"},
        {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "auto"},
    ]
    [message] = responses_messages(None, [{"role": "user", "content": content}])
    assert message["content"] == [
        {"type": "text", "text": "Look:"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
    ]


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"conversation": "conv_1"}, "conversation"),
        ({"tools": [{"type": "web_search"}]}, "tools[0]"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "item_reference"),
        ({"input": [{"type": "computer_call_output", "call_id": "c"}]}, "input[0].type"),
        ({"input": [{"role": "user", "content": [{"type": "input_file"}]}]}, "input_file"),
        ({"tool_choice": {"type": "allowed_tools"}}, "tool_choice"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"input": 3}, "input"),
    ],
)
def test_untranslatable_requests_are_refused_with_the_field(
    fields: dict[str, Any], needle: str
) -> None:
    with pytest.raises(GatewayError) as info:
        responses_to_chat(request(**fields), "s")
    assert info.value.kind == "invalid_request" and info.value.status == 400
    assert needle in info.value.message


def test_errors_use_openais_envelope() -> None:
    exc = GatewayError("context_length_exceeded", "too long: 2000 > 1024", status=400)
    response = openai_error(exc, context_param="input")
    assert response.status_code == 400
    assert json.loads(bytes(response.body)) == {
        "error": {
            "message": "too long: 2000 > 1024",
            "type": "invalid_request_error",
            "param": "input",
            "code": "context_length_exceeded",
        }
    }
    overloaded = openai_error(GatewayError("overloaded", "busy", status=429), context_param="input")
    assert overloaded.status_code == 429 and overloaded.headers["retry-after"] == "1"
    assert json.loads(bytes(overloaded.body))["error"]["code"] == "rate_limit_exceeded"


def test_adjacent_model_turns_stay_two_messages() -> None:
    """A turn's reasoning item starts a new assistant message even right after another."""
    first, second = choice("Thinking aloud."), choice("5", reasoning="2 + 3 is 5")
    items = [{"role": "user", "content": "Hi"}, *output_items(first), *output_items(second)]
    assert responses_messages(None, items)[1:] == [canonical(first), canonical(second)]
