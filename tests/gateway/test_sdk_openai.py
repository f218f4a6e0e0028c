"""The official ``openai`` SDK drives calculator agents through the gateway and the demo
model: Chat Completions (plain, streamed, parallel sessions) and the Responses API (plain
and streamed), each recorded token-exact; a harness that drops an early message gets a new
segment, and a context overflow comes back as OpenAI's own error."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState

from ._served import (
    DESCRIPTION,
    MODEL,
    NAME,
    PARAMETERS,
    PROMPTS,
    SYSTEM,
    Served,
    run_tool,
    served_fixture,  # noqa: F401  (the fixture "served")
)

pytestmark = pytest.mark.slow

CHAT_TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {"name": NAME, "description": DESCRIPTION, "parameters": PARAMETERS},
    }
]
RESPONSES_TOOLS: list[Any] = [
    {"type": "function", "name": NAME, "description": DESCRIPTION, "parameters": PARAMETERS}
]


def client(served: Served, session: str) -> openai.OpenAI:
    """An SDK client configured as a harness would be: base URL and key (the session)."""
    return openai.OpenAI(
        base_url=f"{served.url}/v1",
        api_key="harness-key",
        default_headers={"X-Toolrollout-Session": session},
        max_retries=0,
    )


def chat_agent(
    sdk: openai.OpenAI, question: str, *, turns: int = 4, stream: bool = False
) -> list[Any]:
    """The usual agent loop: call the model, run its tool calls, until it answers (each
    answer read whole, or from the SDK's stream)."""
    messages: list[Any] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": question},
    ]
    for _ in range(turns):
        reply: Any
        if stream:
            chunks = sdk.chat.completions.create(
                model=MODEL, messages=messages, tools=CHAT_TOOLS, temperature=0, max_tokens=96,
                stream=True,
            )  # fmt: skip
            message = ChatCompletionStreamState()
            for chunk in chunks:
                message.handle_chunk(chunk)
            reply = message.get_final_completion()
        else:
            reply = sdk.chat.completions.create(
                model=MODEL, messages=messages, tools=CHAT_TOOLS, temperature=0, max_tokens=96
            )
        answer = reply.choices[0].message
        messages.append(answer.model_dump(exclude_none=True, exclude={"parsed"}))
        if not answer.tool_calls:
            return messages
        for call in answer.tool_calls:
            assert call.type == "function"
            result = run_tool(call.function.name, call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return messages


def test_a_streamed_agent_records_the_tokens_a_plain_one_records(served: Served) -> None:
    """The same greedy agent read from the stream and whole: token-identical rows."""
    sessions = [served.session(), served.session()]
    plain = chat_agent(client(served, sessions[0]), PROMPTS[3])
    streamed = chat_agent(client(served, sessions[1]), PROMPTS[3], stream=True)
    assert [m["role"] for m in streamed] == [m["role"] for m in plain]
    assert len(streamed) >= 5  # at least one tool turn
    [a], [b] = served.close(sessions[0]), served.close(sessions[1])
    turns = sum(1 for m in streamed if m["role"] == "assistant")
    assert b.num_turns == b.metrics["gateway"]["requests"] == turns  # one segment, extended
    for name in ("prompt_ids", "response_ids", "loss_mask", "rollout_logprobs"):
        assert getattr(a, name) == getattr(b, name), name


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": NAME}}], ids=["any", "named"]
)
def test_tool_choice_makes_the_demo_model_call(served: Served, choice: Any) -> None:
    """The model is asked something it answers without a tool; the forced head makes it a
    call, the forced ids are masked and the row is still token-exact."""
    session = served.session()
    reply = client(served, session).chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPTS[1]}],
        tools=CHAT_TOOLS,
        tool_choice=choice,
        temperature=0,
        max_tokens=96,
    )
    calls = reply.choices[0].message.tool_calls or []
    assert len(calls) == 1
    call = calls[0]
    assert call.type == "function"
    assert call.function.name == NAME
    assert run_tool(call.function.name, call.function.arguments) == "42"
    [row] = served.close(session)
    [[start, length]] = row.metrics["gateway"]["forced_tokens"]
    assert start == 0 and length > 0 and row.loss_mask[:length] == [0] * length


def test_chat_completions_agent_is_recorded_token_exact(served: Served) -> None:
    session = served.session()
    messages = chat_agent(client(served, session), PROMPTS[0])
    assert [m["role"] for m in messages] == [
        "system", "user", "assistant", "tool", "assistant",
    ]  # fmt: skip
    assert messages[3]["content"] == "1364"  # the harness's tool ran
    [row] = served.close(session)
    assert row.num_turns == 2 and row.num_tool_calls == 1
    assert row.metrics["gateway"]["segment_reason"] == "new"
    assert [(m["role"], m.get("content")) for m in row.messages if m["role"] != "assistant"] == [
        (m["role"], m["content"]) for m in messages if m["role"] != "assistant"
    ]


def test_chat_completions_streamed_agent(served: Served) -> None:
    session = served.session()
    sdk = client(served, session)
    messages: list[Any] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": PROMPTS[1]},
    ]
    for _ in range(4):
        stream = sdk.chat.completions.create(
            model=MODEL, messages=messages, tools=CHAT_TOOLS, temperature=0, stream=True
        )
        content, calls = "", dict[int, dict[str, str]]()
        for chunk in stream:
            for choice in chunk.choices:
                content += choice.delta.content or ""
                for delta in choice.delta.tool_calls or ():
                    slot = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                    slot["id"] += delta.id or ""
                    if delta.function is not None:
                        slot["name"] += delta.function.name or ""
                        slot["arguments"] += delta.function.arguments or ""
        message: dict[str, Any] = {"role": "assistant", "content": content or None}
        if calls:
            message["tool_calls"] = [
                {"id": c["id"], "type": "function",
                 "function": {"name": c["name"], "arguments": c["arguments"]}}
                for c in calls.values()
            ]  # fmt: skip
        messages.append(message)
        if not calls:
            break
        for c in calls.values():
            result = run_tool(c["name"], c["arguments"])
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": result})
    assert messages[-1]["role"] == "assistant" and "tool_calls" not in messages[-1]
    [row] = served.close(session)
    assert row.num_turns == len([m for m in messages if m["role"] == "assistant"])


def responses_agent(sdk: openai.OpenAI, question: str, *, stream: bool = False) -> list[Any]:
    """A Responses-API agent: the whole input each call (``store=False``), the model's
    ``output`` items replayed, one ``function_call_output`` per call."""
    items: list[Any] = [{"role": "user", "content": question}]
    for _ in range(4):
        kwargs: dict[str, Any] = dict(
            model=MODEL, instructions=SYSTEM, input=items, tools=RESPONSES_TOOLS,
            temperature=0, max_output_tokens=96, store=False,
        )  # fmt: skip
        if stream:
            with sdk.responses.stream(**kwargs) as events:
                kinds = [event.type for event in events]
                response = events.get_final_response()
            assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
            assert "response.output_item.done" in kinds
        else:
            response = sdk.responses.create(**kwargs)
        assert response.status == "completed"
        items += [item.model_dump(exclude_none=True) for item in response.output]
        calls = [item for item in response.output if item.type == "function_call"]
        if not calls:
            assert response.output_text
            return items
        for call in calls:
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": call.call_id,
                    "output": run_tool(call.name, call.arguments),
                }
            )
    return items


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_responses_agent_is_recorded_token_exact(served: Served, stream: bool) -> None:
    session = served.session()
    items = responses_agent(client(served, session), PROMPTS[2], stream=stream)
    outputs = [i["output"] for i in items if i.get("type") == "function_call_output"]
    assert outputs == ["117"]
    [row] = served.close(session)
    assert row.num_turns == 2 and row.num_tool_calls == 1
    assert [(m["role"], m["content"]) for m in row.messages if m["role"] != "assistant"] == [
        ("system", SYSTEM), ("user", PROMPTS[2]), ("tool", "117"),
    ]  # fmt: skip
    replies = [i for i in items if i.get("type") == "message" and i["role"] == "assistant"]
    recorded = [m for m in row.messages if m["role"] == "assistant"]
    assert recorded[-1]["content"] == replies[-1]["content"][0]["text"]
    [call] = recorded[0]["tool_calls"]
    [sent] = [i for i in items if i.get("type") == "function_call"]
    assert (call["id"], call["function"]["name"]) == (sent["call_id"], sent["name"])


async def test_parallel_sessions_each_get_their_own_row(served: Served) -> None:
    """Four agents at once (two per API), each its own session by API key."""
    sessions = [served.session() for _ in PROMPTS]

    async def one(i: int) -> None:
        sdk = client(served, sessions[i])
        work = chat_agent if i % 2 == 0 else responses_agent
        await asyncio.to_thread(work, sdk, PROMPTS[i])

    await asyncio.gather(*(one(i) for i in range(len(PROMPTS))))
    for i, session in enumerate(sessions):
        [row] = served.close(session)
        assert row.metrics["gateway"]["session"] == session
        assert PROMPTS[i] in json.dumps(row.messages)


def test_a_dropped_early_message_starts_a_new_segment(served: Served) -> None:
    """A harness that compacts its history (drops the system message) after a tool turn:
    the first segment keeps what was true, the second starts over, both token-exact."""
    session = served.session()
    sdk = client(served, session)
    first = chat_agent(sdk, PROMPTS[0], turns=1)
    assert first[-1]["role"] == "tool"
    compacted = first[1:]  # the system message is gone
    reply = sdk.chat.completions.create(
        model=MODEL, messages=compacted, tools=CHAT_TOOLS, temperature=0, max_tokens=64
    )
    assert reply.choices[0].message is not None
    rows = served.close(session)
    assert [r.metrics["gateway"]["segment_reason"] for r in rows] == ["new", "history_rewritten"]
    assert [len(r.messages) for r in rows] == [3, 4]
    assert rows[1].messages[0]["role"] == "user"


def test_context_overflow_is_openais_error(served: Served) -> None:
    sdk = client(served, served.session())
    long = "7 + " * 2000 + "7"
    with pytest.raises(openai.BadRequestError) as info:
        sdk.responses.create(model=MODEL, input=long, tools=RESPONSES_TOOLS)
    assert info.value.status_code == 400
    assert info.value.code == "context_length_exceeded"
    assert isinstance(info.value.body, dict) and info.value.body["param"] == "input"
    with pytest.raises(openai.NotFoundError) as missing:
        sdk.responses.create(model=MODEL, input="hi", previous_response_id="resp_1")
    assert missing.value.code == "previous_response_not_found"
