"""The official ``anthropic`` SDK drives calculator agents through the gateway's Messages
API and the demo model: plain, streamed (``messages.stream``), in parallel sessions, and
with a harness that compacts its history; every row token-exact, errors in Anthropic's
envelope."""

from __future__ import annotations

import asyncio
from typing import Any

import anthropic
import pytest

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

TOOLS: list[Any] = [{"name": NAME, "description": DESCRIPTION, "input_schema": PARAMETERS}]


def client(served: Served, session: str) -> anthropic.Anthropic:
    """Configured as a harness would be: the gateway's base URL and the session as key."""
    return anthropic.Anthropic(
        base_url=served.url,
        api_key="harness-key",
        default_headers={"X-Toolrollout-Session": session},
        max_retries=0,
    )


def step(sdk: anthropic.Anthropic, messages: list[Any], *, stream: bool) -> anthropic.types.Message:
    # The SDK has no sampling parameters any more; extra_body sends the gateway's.
    kwargs: dict[str, Any] = dict(
        model=MODEL, system=SYSTEM, messages=messages, tools=TOOLS,
        max_tokens=96, extra_body={"temperature": 0},
    )  # fmt: skip
    if not stream:
        message: anthropic.types.Message = sdk.messages.create(**kwargs)
        return message
    with sdk.messages.stream(**kwargs) as events:
        kinds = [event.type for event in events]
        final = events.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_stop" in kinds
    return final


def agent(sdk: anthropic.Anthropic, messages: list[Any], *, stream: bool = False) -> list[Any]:
    """The Messages agent loop: append the answer's blocks, answer each ``tool_use`` with a
    ``tool_result`` in the next user message, until the model ends its turn."""
    for _ in range(4):
        reply = step(sdk, messages, stream=stream)
        messages.append(
            {
                "role": "assistant",
                "content": [b.model_dump(exclude_none=True) for b in reply.content],
            }
        )
        uses = [block for block in reply.content if block.type == "tool_use"]
        if not uses:
            assert reply.stop_reason == "end_turn"
            return messages
        assert reply.stop_reason == "tool_use"
        messages.append(
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": u.id,
                        "content": run_tool(u.name, u.input),
                    }
                    for u in uses
                ],
            }
        )
    return messages


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_messages_agent_is_recorded_token_exact(served: Served, stream: bool) -> None:
    session = served.session()
    question = [{"role": "user", "content": PROMPTS[0]}]
    messages = agent(client(served, session), question, stream=stream)
    assert messages[2]["content"][0]["content"] == "1364"  # the harness's tool ran
    [row] = served.close(session)
    assert row.num_turns == 2 and row.num_tool_calls == 1
    assert [(m["role"], m["content"]) for m in row.messages if m["role"] != "assistant"] == [
        ("system", SYSTEM), ("user", PROMPTS[0]), ("tool", "1364"),
    ]  # fmt: skip
    recorded = [m for m in row.messages if m["role"] == "assistant"]
    [call] = recorded[0]["tool_calls"]
    [use] = messages[1]["content"]
    assert (call["id"], call["function"]["name"]) == (use["id"], use["name"])
    assert recorded[-1]["content"] == messages[-1]["content"][0]["text"]


async def test_parallel_streamed_sessions(served: Served) -> None:
    sessions = [served.session() for _ in PROMPTS[:2]]

    async def one(session: str, question: str) -> list[Any]:
        sdk = client(served, session)
        return await asyncio.to_thread(
            agent, sdk, [{"role": "user", "content": question}], stream=True
        )

    questions = PROMPTS[:2]
    done = await asyncio.gather(*(one(s, q) for s, q in zip(sessions, questions, strict=True)))
    for session, question, messages in zip(sessions, questions, done, strict=True):
        [row] = served.close(session)
        assert row.messages[1] == {"role": "user", "content": question}
        assert row.num_turns == len([m for m in messages if m["role"] == "assistant"])


def test_compacted_history_starts_a_new_segment(served: Served) -> None:
    """After a tool exchange the harness keeps only the question and the final answer and
    asks again: a new segment (the dropped messages are not spliced), both token-exact."""
    session = served.session()
    sdk = client(served, session)
    messages = agent(sdk, [{"role": "user", "content": PROMPTS[0]}])
    assert len(messages) == 4
    compacted = [messages[0], messages[3], {"role": "user", "content": PROMPTS[1]}]
    agent(sdk, compacted)
    rows = served.close(session)
    assert [r.metrics["gateway"]["segment_reason"] for r in rows] == ["new", "history_rewritten"]
    assert rows[1].metrics["gateway"]["common_messages"] == 2  # system and first question
    assert [m["role"] for m in rows[1].messages[:4]] == ["system", "user", "assistant", "user"]


def test_count_tokens_is_the_prompt_the_gateway_renders(served: Served) -> None:
    """``/v1/messages/count_tokens`` (Claude Code calls it) counts what a new segment's
    prompt is: the same number the answer's usage reports."""
    sdk = client(served, served.session())
    messages: list[Any] = [{"role": "user", "content": PROMPTS[3]}]
    counted = sdk.messages.count_tokens(
        model=MODEL, system=SYSTEM, messages=messages, tools=TOOLS
    ).input_tokens
    reply = step(sdk, messages, stream=False)
    assert counted == reply.usage.input_tokens + (reply.usage.cache_read_input_tokens or 0)
    assert counted > 50  # the system prompt renders the tool's schema


def test_errors_come_in_anthropics_envelope(served: Served) -> None:
    sdk = client(served, served.session())
    with pytest.raises(anthropic.BadRequestError) as info:
        sdk.messages.create(
            model=MODEL, max_tokens=16, messages=[{"role": "user", "content": "7 + " * 2000}]
        )
    body = info.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert "maximum context length" in body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as bad:
        sdk.messages.create(
            model=MODEL,
            max_tokens=16,
            messages=[{"role": "user", "content": "hi"}],
            tools=[{"type": "bash_20250124", "name": "bash"}],
        )
    assert "tools[0]" in str(bad.value)
