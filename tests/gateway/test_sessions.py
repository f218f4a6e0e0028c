"""Sessions and segments: extending requests reuse the recorded ids, rewrites fork.

A scripted engine answers (so the model's ids are known exactly); the harness sends the
messages back as an OpenAI SDK user does. Each finished segment must equal a fresh render
of its final messages under the family's rule (``check_drift``), keep the engine's
logprobs and weight version on model turns, and mask everything the harness sent.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from toolrollout.apps.gateway import ChatRequest, Gateway, GatewayConfig, GatewayError

from .conftest import TOOLS, Model, assert_token_exact, call_text, sent_back, tool_results

SYSTEM = {"role": "system", "content": "You are a careful calculator assistant."}


def ask(session: str, messages: list[dict[str, Any]], **kw: Any) -> ChatRequest:
    return ChatRequest(session=session, messages=tuple(messages), tools=TOOLS, **kw)


async def run_agent(gateway: Gateway, session: str, question: str) -> list[dict[str, Any]]:
    """Tool call, tool result, answer: the loop an SDK agent runs."""
    messages = [SYSTEM, {"role": "user", "content": question}]
    first = await gateway.complete(ask(session, messages))
    assert first.choices[0].finish_reason == "tool_calls"
    messages += [sent_back(first.choices[0]), *tool_results(first)]
    second = await gateway.complete(ask(session, messages))
    assert second.choices[0].finish_reason == "stop"
    messages.append(sent_back(second.choices[0]))
    return messages


def answers(request: Any, tokenizer: Any) -> str:
    """A tool call on the first turn of a conversation, an answer after a tool result."""
    text = tokenizer.decode(list(request.input_ids))
    if text.rstrip().endswith("</tool_response><|im_end|>\n<|im_start|>assistant"):
        return "The result is 42."
    return call_text("6*7")


async def test_an_agent_loop_is_one_token_exact_segment(tokenizer: Any) -> None:
    model = Model(tokenizer, lambda r: answers(r, tokenizer))
    async with Gateway(model.engine, tokenizer) as gateway:
        await run_agent(gateway, "s1", "What is 6*7?")
        (row,) = gateway.close_session("s1", reward=1.0)
        chat = gateway.chat_format(TOOLS)
    assert row.metrics["gateway"]["segment_reason"] == "new"
    assert (row.num_turns, row.num_tool_calls, row.reward) == (2, 1, 1.0)
    assert row.weight_version == "v7"
    # the model spans are the engine's ids verbatim, in order
    model_spans = [s.ids for s in row.spans if s.kind == "model"]
    assert model_spans == list(model.outputs.values())
    assert [s.kind for s in row.spans] == ["model", "tool", "model"]
    # the second request was the first one's ids plus the delta: no re-tokenization
    first, second = model.engine.requests
    assert list(second.input_ids[: len(first.input_ids)]) == list(first.input_ids)
    assert tuple(second.input_ids[len(first.input_ids) :][: len(model_spans[0])]) == model_spans[0]
    assert_token_exact(row, chat)


async def test_a_corrupted_transcript_is_counted_as_drift(
    demo_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The row's drift count is the rollout loop's check of the transcript: a delta that is
    not the template's (here its last token dropped, as a broken turn boundary would) is
    recorded as sent and counted, and the same session without the fault counts none."""
    from toolrollout.chat import ChatFormat

    model = Model(demo_tokenizer, lambda r: answers(r, demo_tokenizer))
    async with Gateway(model.engine, demo_tokenizer) as gateway:
        await run_agent(gateway, "clean", "What is 6*7?")
        (clean,) = gateway.close_session("clean")
        real = ChatFormat.tool_turn_delta

        def broken(self: ChatFormat, *args: Any, **kwargs: Any) -> list[int]:
            return list(real(self, *args, **kwargs))[:-1]

        monkeypatch.setattr(ChatFormat, "tool_turn_delta", broken)
        await run_agent(gateway, "corrupt", "What is 6*7?")
        (corrupt,) = gateway.close_session("corrupt")
    assert clean.metrics["drift_mismatches"] == 0 and "drift_reports" not in clean.metrics
    assert corrupt.metrics["drift_mismatches"] == 1
    (report,) = corrupt.metrics["drift_reports"]
    assert report["kind"] == "text" and not report["matches"]


async def test_a_dropped_early_message_starts_a_new_segment(demo_tokenizer: Any) -> None:
    tok = demo_tokenizer
    model = Model(tok, lambda r: answers(r, tok))
    async with Gateway(model.engine, tok) as gateway:
        messages = await run_agent(gateway, "s", "What is 6*7?")
        # the harness compacts: drops the first exchange, keeps the answer, asks again
        compacted = [SYSTEM, messages[-1], {"role": "user", "content": "And 2+2?"}]
        await gateway.complete(ask("s", compacted))
        rows = gateway.close_session("s")
        chat = gateway.chat_format(TOOLS)
    assert [r.sample_index for r in rows] == [0, 1]
    first, second = rows
    assert first.num_turns == 2 and first.finish_reason == "stop"
    info = second.metrics["gateway"]
    assert info["segment_reason"] == "history_rewritten"
    assert info["parent_segment"] == 0 and info["common_messages"] == 1
    assert second.group_id == first.group_id == "s"
    assert second.prompt_index == first.prompt_index
    for row in rows:
        assert_token_exact(row, chat)


async def test_an_edited_tool_result_is_never_spliced(demo_tokenizer: Any) -> None:
    tok = demo_tokenizer
    model = Model(tok, lambda r: answers(r, tok))
    async with Gateway(model.engine, tok) as gateway:
        messages = await run_agent(gateway, "s", "What is 6*7?")
        edited = [dict(m) for m in messages]
        edited[3]["content"] = "41"  # the tool result, rewritten
        edited.append({"role": "user", "content": "Sure?"})
        await gateway.complete(ask("s", edited))
        rows = gateway.close_session("s")
        chat = gateway.chat_format(TOOLS)
    assert len(rows) == 2
    assert rows[1].metrics["gateway"]["common_messages"] == 3
    assert "41" in rows[1].messages[3]["content"]
    for row in rows:
        assert_token_exact(row, chat)


async def test_an_sdk_resending_an_equal_message_extends(demo_tokenizer: Any) -> None:
    """Empty fields, text parts and re-serialised JSON arguments are not edits."""
    tok = demo_tokenizer
    model = Model(tok, lambda r: answers(r, tok))
    async with Gateway(model.engine, tok) as gateway:
        messages = [SYSTEM, {"role": "user", "content": "What is 6*7?"}]
        first = await gateway.complete(ask("s", messages))
        back = sent_back(first.choices[0])
        back["tool_calls"][0]["function"]["arguments"] = '{ "expression" : "6*7" }'
        back["refusal"] = None
        resent: list[dict[str, Any]] = [
            SYSTEM,
            {"role": "user", "content": [{"type": "text", "text": "What is 6*7?"}]},
            back,
            *tool_results(first),
        ]
        await gateway.complete(ask("s", resent))
        (row,) = gateway.close_session("s")
    assert row.num_turns == 2


async def test_parallel_sessions_stay_apart(demo_tokenizer: Any) -> None:
    tok = demo_tokenizer
    model = Model(tok, lambda r: answers(r, tok), delay=0.01)
    async with Gateway(model.engine, tok) as gateway:
        await asyncio.gather(*(run_agent(gateway, f"p{i}", f"What is {i}*7?") for i in range(8)))
        assert len(gateway.sessions()) == 8
        rows = [r for i in range(8) for r in gateway.close_session(f"p{i}")]
        chat = gateway.chat_format(TOOLS)
    assert len(rows) == 8 and {r.group_id for r in rows} == {f"p{i}" for i in range(8)}
    assert len({r.prompt_index for r in rows}) == 8
    for i, row in enumerate(rows):
        assert row.num_turns == 2 and f"What is {i}*7?" in row.messages[1]["content"]
        assert_token_exact(row, chat)


async def test_concurrent_requests_of_one_segment_fork(demo_tokenizer: Any) -> None:
    tok = demo_tokenizer
    model = Model(tok, lambda r: answers(r, tok), delay=0.05)
    async with Gateway(model.engine, tok) as gateway:
        messages = [SYSTEM, {"role": "user", "content": "What is 6*7?"}]
        first = await gateway.complete(ask("s", messages))
        follow = [*messages, sent_back(first.choices[0]), *tool_results(first)]
        await asyncio.gather(gateway.complete(ask("s", follow)), gateway.complete(ask("s", follow)))
        rows = gateway.close_session("s")
        chat = gateway.chat_format(TOOLS)
    assert sorted(r.metrics["gateway"]["segment_reason"] for r in rows) == ["concurrent", "new"]
    for row in rows:
        assert_token_exact(row, chat)


async def test_n_choices_the_harness_picks_one(demo_tokenizer: Any) -> None:
    tok = demo_tokenizer
    texts = iter([call_text("6*7"), call_text("7*6"), "The result is 42."])
    model = Model(tok, lambda r: next(texts))
    async with Gateway(model.engine, tok) as gateway:
        messages = [SYSTEM, {"role": "user", "content": "What is 6*7?"}]
        first = await gateway.complete(ask("s", messages, n=2))
        assert len(first.choices) == 2
        picked = first.choices[1]
        messages += [
            sent_back(picked),
            {"role": "tool", "tool_call_id": picked.tool_calls[0].id, "content": "42"},
        ]
        await gateway.complete(ask("s", messages))
        (row,) = gateway.close_session("s")
        chat = gateway.chat_format(TOOLS)
    assert row.spans[0].ids == list(model.outputs.values())[1]
    assert row.metrics["gateway"]["assumed_choice_0"] is False
    assert_token_exact(row, chat)


async def test_a_turn_cut_at_its_limit_is_not_extended(demo_tokenizer: Any) -> None:
    tok = demo_tokenizer
    model = Model(tok, ["The result is forty-two and more words", "ok"])
    async with Gateway(model.engine, tok) as gateway:
        messages = [SYSTEM, {"role": "user", "content": "What is 6*7?"}]
        first = await gateway.complete(ask("s", messages, max_tokens=3))
        assert first.choices[0].finish_reason == "length"
        messages += [sent_back(first.choices[0]), {"role": "user", "content": "go on"}]
        await gateway.complete(ask("s", messages))
        rows = gateway.close_session("s")
    assert [r.finish_reason for r in rows] == ["length", "stop"]
    assert rows[0].status == "truncated"
    assert rows[1].metrics["gateway"]["segment_reason"] == "after_length"


async def test_context_overflow_is_the_apis_error_and_recorded(demo_tokenizer: Any) -> None:
    tok = demo_tokenizer
    model = Model(tok, lambda r: answers(r, tok), context_length=400)
    async with Gateway(model.engine, tok, context_length=400) as gateway:
        messages = [SYSTEM, {"role": "user", "content": "What is 6*7?"}]
        first = await gateway.complete(ask("s", messages))
        messages += [sent_back(first.choices[0]), *tool_results(first, "9 " * 400)]
        with pytest.raises(GatewayError) as caught:
            await gateway.complete(ask("s", messages))
        assert caught.value.kind == "context_length_exceeded" and caught.value.status == 400
        assert "maximum context length is 400 tokens" in caught.value.message
        assert gateway.sessions()["s"]["errors"] == {"context_length_exceeded": 1}
        (row,) = gateway.close_session("s")
    assert row.finish_reason == "context_length_exceeded" and row.status == "truncated"


async def test_rewards_attach_per_session_or_segment(demo_tokenizer: Any) -> None:
    tok = demo_tokenizer
    model = Model(tok, lambda r: answers(r, tok))
    async with Gateway(model.engine, tok) as gateway:
        messages = await run_agent(gateway, "s", "What is 6*7?")
        await gateway.complete(ask("s", [SYSTEM, {"role": "user", "content": "2+2?"}]))
        gateway.attach_reward("s", 0.5)
        gateway.attach_reward("s", 1.0, segment=1)
        with pytest.raises(GatewayError, match="no segment 5"):
            gateway.attach_reward("s", 1.0, segment=5)
        rows = gateway.close_session("s")
        with pytest.raises(GatewayError, match="no open session"):
            gateway.attach_reward("s", 1.0)
        assert gateway.records("s") == rows
    assert [r.reward for r in rows] == [0.5, 1.0]
    assert len(messages) == 5


async def test_idle_sessions_are_closed_and_kept(demo_tokenizer: Any) -> None:
    tok = demo_tokenizer
    model = Model(tok, lambda r: answers(r, tok))
    config = GatewayConfig(idle_timeout=0.2, flush_seconds=0.05)
    async with Gateway(model.engine, tok, config=config) as gateway:
        await run_agent(gateway, "s", "What is 6*7?")
        for _ in range(100):
            if not gateway.sessions():
                break
            await asyncio.sleep(0.02)
        assert not gateway.sessions()
        assert len(gateway.records("s")) == 1


async def test_the_segments_of_a_session_are_bounded(demo_tokenizer: Any) -> None:
    tok = demo_tokenizer
    model = Model(tok, lambda r: "ok")
    config = GatewayConfig(max_segments=2, max_open_segments=1)
    async with Gateway(model.engine, tok, config=config) as gateway:
        for q in ("a", "b"):
            await gateway.complete(ask("s", [{"role": "user", "content": q}]))
        assert sum(s.open for s in gateway.session("s").segments) == 1  # type: ignore[union-attr]
        with pytest.raises(GatewayError, match="--max-segments"):
            await gateway.complete(ask("s", [{"role": "user", "content": "c"}]))


@pytest.mark.parametrize(
    ("messages", "fragment"),
    [
        ([], "must not be empty"),
        ([{"role": "wizard", "content": "x"}], "role must be one of"),
        ([{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], "prefill"),
    ],
)
async def test_bad_requests(demo_tokenizer: Any, messages: list[Any], fragment: str) -> None:
    model = Model(demo_tokenizer, lambda r: "ok")
    async with Gateway(model.engine, demo_tokenizer) as gateway:
        with pytest.raises(GatewayError, match=fragment) as caught:
            await gateway.complete(ask("s", messages))
    assert caught.value.kind == "invalid_request" and not model.engine.requests
