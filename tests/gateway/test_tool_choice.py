"""``tool_choice`` ``required`` and a named function make the turn a tool call.

The gateway forces the family's call opener (and, for a named function, the call's head up
to its arguments) into the generation as ids the model did not sample: the engine sees
them at the end of its input, the row keeps them in the turn with loss mask 0, and the
model's own ids follow with loss mask 1. A model that still produces no call is answered
with an error, never with plain text. Driven by the ``openai`` and ``anthropic`` SDKs.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anthropic
import openai
import pytest

from toolrollout.apps.gateway import Gateway, GatewayConfig
from toolrollout.chat.parsers import get_tool_parser, tool_parser_names
from toolrollout.engines import GenerateRequest

from .conftest import TOOLS, Model, assert_token_exact, call_text, served

ASSISTANT = "<|im_start|>assistant\n"
MESSAGES: list[Any] = [
    {"role": "system", "content": "You are a careful calculator assistant."},
    {"role": "user", "content": "What is 6*7?"},
]
SECOND_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a word up.",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
    },
}


def forced_text(request: GenerateRequest, tokenizer: Any) -> str:
    """What the gateway put after the generation prompt (the forced ids, as text)."""
    text = str(tokenizer.decode(list(request.input_ids)))
    return text[text.rindex(ASSISTANT) + len(ASSISTANT) :]


def continue_call(request: GenerateRequest, tokenizer: Any) -> str:
    """A model that completes whatever call head was forced, with a call to calculator."""
    full, head = call_text("6*7"), forced_text(request, tokenizer)
    assert full.startswith(head), head
    return full[len(head) :]


@asynccontextmanager
async def clients(
    model: Model, config: GatewayConfig | None = None
) -> AsyncIterator[tuple[Any, Any, Gateway]]:
    """The ``openai`` (session ``s1``) and ``anthropic`` (session ``s2``) SDKs' clients."""
    async with served(model, config) as (url, gateway):
        oa = openai.AsyncOpenAI(
            base_url=f"{url}/v1",
            api_key="harness-key",
            default_headers={"X-Toolrollout-Session": "s1"},
            max_retries=0,
        )
        an = anthropic.AsyncAnthropic(
            base_url=url,
            api_key="harness-key",
            default_headers={"X-Toolrollout-Session": "s2"},
            max_retries=0,
        )
        yield oa, an, gateway


@pytest.mark.parametrize(
    ("choice", "head"),
    [
        ("required", "<tool_call>"),  # its "\n" could merge with the model's next one
        (
            {"type": "function", "function": {"name": "calculator"}},
            '<tool_call>\n{"name": "calculator", "arguments":',
        ),
    ],
)
async def test_a_forced_call_is_recorded_with_its_forced_ids_masked(
    demo_tokenizer: Any, choice: Any, head: str
) -> None:
    model = Model(demo_tokenizer, lambda r: continue_call(r, demo_tokenizer))
    tools = [*TOOLS, SECOND_TOOL]
    async with clients(model) as (client, _, gateway):
        reply = await client.chat.completions.create(
            model="m", messages=MESSAGES, tools=tools, tool_choice=choice
        )
        (row,) = gateway.close_session("s1")
        chat = gateway.chat_format(tools)
    calls = reply.choices[0].message.tool_calls or []
    assert len(calls) == 1
    call = calls[0]
    assert call.function.name == "calculator"
    assert json.loads(call.function.arguments) == {"expression": "6*7"}
    assert reply.choices[0].finish_reason == "tool_calls"
    assert forced_text(model.engine.requests[0], demo_tokenizer) == head
    forced_ids = demo_tokenizer.encode(head, add_special_tokens=False)
    assert row.metrics["gateway"]["forced_tokens"] == [[0, len(forced_ids)]]
    n = len(forced_ids)
    assert list(row.response_ids[:n]) == forced_ids
    assert list(row.loss_mask[:n]) == [0] * n  # forced: never trained on as sampled
    assert set(row.loss_mask[n:]) == {1}
    assert list(row.rollout_logprobs[:n]) == [0.0] * n
    assert_token_exact(row, chat)  # the turn is still a fresh render of its call


async def test_a_forced_turn_is_drift_checked_as_one_turn(demo_tokenizer: Any) -> None:
    """A forced call, its tool result, the answer: the drift check (after the delta) reads
    the forced ids and the model's as one turn's text, so the row matches a fresh render;
    split apart (the model's ids alone as the turn) it would not."""
    from toolrollout.chat import ChatFormat

    def model_answer(request: GenerateRequest) -> str:
        if "<tool_response>" in str(demo_tokenizer.decode(list(request.input_ids))):
            return "The result is 42."
        return continue_call(request, demo_tokenizer)

    model = Model(demo_tokenizer, model_answer)
    choice = {"type": "function", "function": {"name": "calculator"}}
    async with clients(model) as (client, _, gateway):
        first = await client.chat.completions.create(
            model="m", messages=MESSAGES, tools=list(TOOLS), tool_choice=choice
        )
        call = (first.choices[0].message.tool_calls or [])[0]
        result = {"role": "tool", "tool_call_id": call.id, "content": "42"}
        messages = [*MESSAGES, first.choices[0].message.model_dump(exclude_none=True), result]
        await client.chat.completions.create(model="m", messages=messages, tools=list(TOOLS))
        state = gateway.session("s1").segments[0].state  # type: ignore[union-attr]
        split = [ChatFormat.model_text(state.shared.chat, s.ids) for s in state.transcript.spans]
        (row,) = gateway.close_session("s1")
    assert row.num_turns == 2 and row.metrics["gateway"]["forced_tokens"][0][0] == 0
    assert row.metrics["drift_mismatches"] == 0 and "drift_reports" not in row.metrics
    assert state.model_texts()[0] == split[0] + split[1]  # the forced head, then the model's
    assert_token_exact(row, gateway.chat_format(TOOLS))


async def test_auto_forces_nothing(demo_tokenizer: Any) -> None:
    model = Model(demo_tokenizer, ["Forty-two."])
    async with clients(model) as (client, _, gateway):
        reply = await client.chat.completions.create(
            model="m", messages=MESSAGES, tools=list(TOOLS), tool_choice="auto"
        )
        (row,) = gateway.close_session("s1")
    assert reply.choices[0].message.content == "Forty-two."
    assert forced_text(model.engine.requests[0], demo_tokenizer) == ""
    assert row.metrics["gateway"]["forced_tokens"] == []


async def test_no_call_under_required_is_an_error_not_text(demo_tokenizer: Any) -> None:
    model = Model(demo_tokenizer, ["I would rather not."] * 2)
    async with clients(model) as (client, messages_client, gateway):
        with pytest.raises(openai.InternalServerError) as caught:
            await client.chat.completions.create(
                model="m", messages=MESSAGES, tools=list(TOOLS), tool_choice="required"
            )
        with pytest.raises(anthropic.InternalServerError) as refused:
            await messages_client.messages.create(
                model="m",
                max_tokens=64,
                messages=[{"role": "user", "content": "6*7?"}],
                tools=[
                    {
                        "name": "calculator",
                        "description": "Evaluate an arithmetic expression.",
                        "input_schema": TOOLS[0]["function"]["parameters"],
                    }
                ],
                tool_choice={"type": "any"},
            )
        assert gateway.sessions()["s1"]["errors"] == {"tool_choice_unmet": 1}
        assert gateway.sessions()["s1"]["model_turns"] == 0
    assert caught.value.status_code == 500
    assert "tool_choice required a tool call" in caught.value.message
    assert refused.value.status_code == 500
    assert "tool_choice required a tool call" in str(refused.value)


async def test_a_named_tool_must_exist(demo_tokenizer: Any) -> None:
    model = Model(demo_tokenizer, ["unused"])
    async with clients(model) as (client, _, _):
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(
                model="m",
                messages=MESSAGES,
                tools=list(TOOLS),
                tool_choice={"type": "function", "function": {"name": "search"}},
            )
    assert "'search', which is not in tools" in caught.value.message
    assert not model.engine.requests


CALLS = {
    "hermes": '<tool_call>\n{"name": "calc", "arguments": {"x": 1}}\n</tool_call>',
    "qwen25": '<tool_call>\n{"name": "calc", "arguments": {"x": 1}}\n</tool_call>',
    "qwen3": '<tool_call>\n{"name": "calc", "arguments": {"x": 1}}\n</tool_call>',
    "llama3": '{"name": "calc", "parameters": {"x": 1}}',
    "mistral": '[TOOL_CALLS][{"name": "calc", "arguments": {"x": 1}}]',
    "pythonic": "[calc(x=1)]",
    "deepseekv3": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>calc\n"
    '```json\n{"x": 1}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    "deepseekv31": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>calc<｜tool▁sep｜>"
    '{"x": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    "glm45": "<tool_call>calc\n<arg_key>x</arg_key>\n<arg_value>1</arg_value>\n</tool_call>",
    "qwen3_coder": "<tool_call>\n<function=calc>\n<parameter=x>\n1\n</parameter>\n</function>"
    "\n</tool_call>",
    "kimi_k2": "<|tool_calls_section_begin|><|tool_call_begin|>functions.calc:0"
    '<|tool_call_argument_begin|>{"x": 1}<|tool_call_end|><|tool_calls_section_end|>',
}


@pytest.mark.parametrize("name", tool_parser_names())
def test_each_format_forces_the_head_of_its_own_calls(name: str) -> None:
    """The forced head (any call, and a call to ``calc``) begins the format's real call
    text, and the stream holds it back: it contains one of the parser's call markers."""
    parser = get_tool_parser(name, tools=[{"name": "calc", "parameters": {"type": "object"}}])
    if name == "gpt-oss":  # harmony: no fixed opener, so nothing is forced or streamed
        assert parser.forced_call_prefix() is None and parser.call_markers is None
        return
    text = CALLS[name]
    assert [call.name for call in parser.parse(text).tool_calls] == ["calc"]
    for head in (parser.forced_call_prefix(), parser.forced_call_prefix("calc")):
        if head is None:
            continue
        assert text.startswith(head), (name, head)
        assert any(marker in head for marker in parser.call_markers or ()), (name, head)


async def test_a_streamed_forced_call_sends_no_content(demo_tokenizer: Any) -> None:
    model = Model(demo_tokenizer, lambda r: continue_call(r, demo_tokenizer))
    async with clients(model) as (client, _, gateway):
        stream = await client.chat.completions.create(
            model="m", messages=MESSAGES, tools=list(TOOLS), tool_choice="required", stream=True
        )
        content, calls = "", list[Any]()
        async for chunk in stream:
            for choice in chunk.choices:
                content += choice.delta.content or ""
                calls += choice.delta.tool_calls or []
        (row,) = gateway.close_session("s1")
    assert content == ""
    assert [call.function.name for call in calls] == ["calculator"]
    assert row.metrics["gateway"]["forced_tokens"][0][0] == 0
