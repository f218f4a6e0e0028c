"""Streamed answers leave the gateway as the engine decodes them, through the real SDKs.

A scripted engine decodes one id every ``token_delay`` seconds behind a gateway served by
uvicorn on a loopback port (an in-process ASGI transport would buffer the whole body), and
the ``openai`` and ``anthropic`` SDKs' own streaming clients read it. The first content
must arrive while the turn is still being decoded, text that may begin a tool call must
never be sent as content, and the recorded transcript must be the one a non-streamed
request of the same conversation records.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from typing import Any

import anthropic
import openai
import pytest

from toolrollout.apps.gateway._stream import IncrementalText, TurnStream

from .conftest import TOOLS, Model, assert_token_exact, call_text, served

SYSTEM = {"role": "system", "content": "You are a careful calculator assistant."}
PROSE = "The result of this long and careful computation is forty-two, as expected."
TOKEN_DELAY = 0.04


def openai_client(url: str, session: str) -> Any:
    return openai.AsyncOpenAI(
        base_url=f"{url}/v1",
        api_key="harness-key",
        default_headers={"X-Toolrollout-Session": session},
        max_retries=0,
    )


async def test_chat_content_streams_while_the_turn_is_decoded(demo_tokenizer: Any) -> None:
    model = Model(demo_tokenizer, [PROSE], token_delay=TOKEN_DELAY)
    async with served(model) as (url, gateway):
        started = time.perf_counter()
        stream = await openai_client(url, "s1").chat.completions.create(
            model="m", messages=[SYSTEM, {"role": "user", "content": "6*7?"}], stream=True
        )
        arrivals: list[float] = []
        pieces: list[str] = []
        async for chunk in stream:
            for choice in chunk.choices:
                if choice.delta.content:
                    arrivals.append(time.perf_counter() - started)
                    pieces.append(choice.delta.content)
        finished = time.perf_counter() - started
        (row,) = gateway.close_session("s1")
    decode = len(row.spans[0].ids) * TOKEN_DELAY
    assert "".join(pieces) == PROSE
    assert len(pieces) >= 5  # token by token, not one block at the end
    # The first words arrive while most of the turn is still being decoded.
    assert arrivals[0] < finished - decode / 2, (arrivals[0], finished, decode)


async def test_a_tool_call_is_never_sent_as_content(demo_tokenizer: Any) -> None:
    text = "Let me compute that.\n" + call_text("6*7")
    model = Model(demo_tokenizer, [text], token_delay=0.005)
    async with served(model) as (url, gateway):
        stream = await openai_client(url, "s1").chat.completions.create(
            model="m",
            messages=[SYSTEM, {"role": "user", "content": "6*7?"}],
            tools=list(TOOLS),
            stream=True,
        )
        pieces: list[str] = []
        calls: list[Any] = []
        async for chunk in stream:
            for choice in chunk.choices:
                pieces += [choice.delta.content] if choice.delta.content else []
                calls += choice.delta.tool_calls or []
        gateway.close_session("s1")
    assert "".join(pieces) == "Let me compute that."
    assert not any("<" in piece for piece in pieces)  # not even "<tool" of the opener
    (call,) = calls
    assert call.function.name == "calculator"
    assert json.loads(call.function.arguments) == {"expression": "6*7"}


def _answers(request: Any, tokenizer: Any) -> str:
    text = tokenizer.decode(list(request.input_ids))
    if text.rstrip().endswith("</tool_response><|im_end|>\n<|im_start|>assistant"):
        return PROSE
    return "I will use the calculator.\n" + call_text("6*7")


async def _chat_agent(client: Any, *, stream: bool) -> list[Any]:
    """A two-turn calculator agent, reading each answer streamed or whole."""
    messages: list[Any] = [SYSTEM, {"role": "user", "content": "What is 6*7?"}]
    for _ in range(3):
        if not stream:
            reply = await client.chat.completions.create(
                model="m", messages=messages, tools=list(TOOLS)
            )
            message = reply.choices[0].message.model_dump(exclude_none=True)
        else:
            chunks = await client.chat.completions.create(
                model="m", messages=messages, tools=list(TOOLS), stream=True
            )
            content, calls = "", []
            async for chunk in chunks:
                for choice in chunk.choices:
                    content += choice.delta.content or ""
                    calls += [
                        c.model_dump(exclude_none=True) for c in choice.delta.tool_calls or []
                    ]
            message = {"role": "assistant", "content": content or None}
            if calls:
                for call in calls:
                    call.pop("index")
                message["tool_calls"] = calls
        messages.append(message)
        if not message.get("tool_calls"):
            return messages
        messages += [
            {"role": "tool", "tool_call_id": call["id"], "content": "42"}
            for call in message["tool_calls"]
        ]
    return messages


async def test_a_streamed_session_records_what_a_plain_one_records(demo_tokenizer: Any) -> None:
    model = Model(demo_tokenizer, lambda r: _answers(r, demo_tokenizer), numbered=False)
    async with served(model) as (url, gateway):
        plain = await _chat_agent(openai_client(url, "plain"), stream=False)
        streamed = await _chat_agent(openai_client(url, "streamed"), stream=True)
        (a,) = gateway.close_session("plain")
        (b,) = gateway.close_session("streamed")
        chat = gateway.chat_format(TOOLS)
    assert [m["role"] for m in streamed] == ["system", "user", "assistant", "tool", "assistant"]
    assert streamed[2]["content"] == plain[2]["content"] == "I will use the calculator."
    assert b.metrics["gateway"]["requests"] == 2  # the second request extended the segment
    for field in ("prompt_ids", "response_ids", "loss_mask", "rollout_logprobs"):
        assert getattr(a, field) == getattr(b, field), field
    assert _without_ids(a.messages) == _without_ids(b.messages)
    assert_token_exact(b, chat)


def _without_ids(messages: Any) -> str:
    """The messages with the (random) call ids blanked."""
    text = json.dumps(messages, sort_keys=True)
    for message in messages:
        for call in message.get("tool_calls") or ():
            text = text.replace(call["id"], "ID")
        if message.get("tool_call_id"):
            text = text.replace(message["tool_call_id"], "ID")
    return text


async def test_a_client_leaving_mid_stream_aborts_and_records_nothing(
    demo_tokenizer: Any,
) -> None:
    model = Model(demo_tokenizer, [PROSE * 4], token_delay=0.05)
    async with served(model) as (url, gateway):
        stream = await openai_client(url, "s1").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], stream=True
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                break
        await stream.close()
        for _ in range(200):
            if model.engine.aborted:
                break
            await asyncio.sleep(0.01)
        assert model.engine.aborted == [model.engine.requests[0].rid]
        assert gateway.sessions()["s1"]["model_turns"] == 0


async def test_anthropic_stream_sends_text_before_the_turn_ends(demo_tokenizer: Any) -> None:
    text = PROSE + "\n" + call_text("6*7")
    model = Model(demo_tokenizer, [text], token_delay=TOKEN_DELAY)
    async with served(model) as (url, gateway):
        client = anthropic.AsyncAnthropic(
            base_url=url,
            api_key="harness-key",
            default_headers={"X-Toolrollout-Session": "s1"},
            max_retries=0,
        )
        tool = {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "input_schema": TOOLS[0]["function"]["parameters"],
        }
        started = time.perf_counter()
        arrivals: list[float] = []
        pieces: list[str] = []
        async with client.messages.stream(
            model="m",
            max_tokens=200,
            messages=[{"role": "user", "content": "6*7?"}],
            tools=[tool],  # type: ignore[list-item]
        ) as stream:
            async for event in stream:
                if event.type == "content_block_delta" and event.delta.type == "text_delta":
                    arrivals.append(time.perf_counter() - started)
                    pieces.append(event.delta.text)
            message = await stream.get_final_message()
        finished = time.perf_counter() - started
        gateway.close_session("s1")
    assert "".join(pieces) == PROSE and not any("<" in piece for piece in pieces)
    assert arrivals[0] < finished / 2, (arrivals[0], finished)
    assert [block.type for block in message.content] == ["text", "tool_use"]
    assert message.stop_reason == "tool_use"


async def test_responses_stream_sends_text_before_the_turn_ends(demo_tokenizer: Any) -> None:
    model = Model(demo_tokenizer, [PROSE], token_delay=TOKEN_DELAY)
    async with served(model) as (url, gateway):
        started = time.perf_counter()
        arrivals: list[float] = []
        async with openai_client(url, "s1").responses.stream(
            model="m", input="6*7?", store=False
        ) as stream:
            async for event in stream:
                if event.type == "response.output_text.delta":
                    arrivals.append(time.perf_counter() - started)  # noqa: PERF401
            final = await stream.get_final_response()
        finished = time.perf_counter() - started
        gateway.close_session("s1")
    assert final.output_text == PROSE and len(arrivals) >= 5
    assert arrivals[0] < finished / 2, (arrivals[0], finished)


# -- what may be shown of a partial turn ----------------------------------------------


def _feed(turn: TurnStream, text: str) -> tuple[str, str]:
    """Feed ``text`` one character at a time; the reasoning and content sent."""
    for end in range(1, len(text) + 1):
        turn.feed(text[:end])
    return turn.reasoning, turn.content


@pytest.mark.parametrize(
    ("text", "content"),
    [
        ("Hello there.", "Hello there."),
        ("  Padded  ", "Padded"),
        ("Sure.\n<tool_call>\n{}\n</tool_call>", "Sure."),
        ("a <tool_cal", "a"),  # could still become the opener: held
        ("x <|im_e", "x"),  # could still become the end-of-turn token: held
        ("<tool_call>", ""),
    ],
)
def test_text_that_may_open_a_call_is_held(text: str, content: str) -> None:
    turn = TurnStream(markers=("<tool_call>",), think=None, thinking=False)
    assert _feed(turn, text) == ("", content)


def test_reasoning_streams_until_the_think_block_closes() -> None:
    turn = TurnStream(markers=("<tool_call>",), think=("<think>", "</think>"), thinking=False)
    assert _feed(turn, "<think>\nadd them\n</think>\n\nIt is 5.") == ("add them", "It is 5.")
    opened = TurnStream(markers=("<tool_call>",), think=("<think>", "</think>"), thinking=True)
    assert _feed(opened, "plan</think>done") == ("plan", "done")
    assert _feed(TurnStream(markers=None, think=None, thinking=False), "unknown format") == (
        "",
        "",
    )  # no known markers: everything waits for the parse


def test_finish_sends_the_rest_of_the_parsed_turn() -> None:
    turn = TurnStream(markers=("<tool_call>",), think=None, thinking=False)
    _feed(turn, "Sure. Then <tool_call>{}</tool_call> more")
    rest = turn.finish(None, "Sure. Then\nmore")
    assert [(d.kind, d.text) for d in rest] == [("content", "\nmore")]
    assert turn.content == "Sure. Then\nmore"


@pytest.mark.parametrize("text", ["Plain words, then more.", "héllo — naïve 😀 ü", "<tool_call>{}"])
def test_incremental_text_is_the_whole_decode(demo_tokenizer: Any, text: str) -> None:
    """Decoding only the new ids each time adds up to decoding them all, and a split
    multi-byte character is never shown half-decoded."""
    ids = demo_tokenizer.encode(text, add_special_tokens=False)
    whole = IncrementalText(lambda part: demo_tokenizer.decode(part, skip_special_tokens=False))
    seen = [whole.extend([token]) for token in ids]
    assert seen[-1] == text
    assert all("\ufffd" not in piece for piece in seen)
    assert all(later.startswith(earlier) for earlier, later in itertools.pairwise(seen))
