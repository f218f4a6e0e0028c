"""Stored responses: ``store`` (true by default), ``previous_response_id``, and ``GET`` /
``DELETE /v1/responses/{id}``, driven by the ``openai`` SDK.

A harness that continues a response by its id sends only the new items; the gateway puts
the stored conversation before them, so the session's segment is extended token-exactly,
as if the harness had replayed everything. The store is bounded: beyond its capacity the
least recently used response is dropped, and continuing it is OpenAI's 404.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest

from toolrollout.apps.gateway import GatewayConfig

from .conftest import TOOLS, Model, assert_token_exact, call_text, served

INSTRUCTIONS = "You are a careful calculator assistant."
RESPONSES_TOOLS: list[Any] = [{"type": "function", **TOOLS[0]["function"]}]


def answers(request: Any, tokenizer: Any) -> str:
    text = tokenizer.decode(list(request.input_ids))
    if text.rstrip().endswith("</tool_response><|im_end|>\n<|im_start|>assistant"):
        return "The result is 42."
    return call_text("6*7")


async def test_previous_response_id_extends_the_segment(demo_tokenizer: Any) -> None:
    model = Model(demo_tokenizer, lambda r: answers(r, demo_tokenizer))
    async with served(model) as (url, gateway):
        client = openai.AsyncOpenAI(
            base_url=f"{url}/v1",
            api_key="harness-key",
            default_headers={"X-Toolrollout-Session": "s1"},
            max_retries=0,
        )
        first = await client.responses.create(
            model="m", instructions=INSTRUCTIONS, input="What is 6*7?", tools=RESPONSES_TOOLS
        )
        (call,) = [item for item in first.output if item.type == "function_call"]
        events = await client.responses.create(
            model="m",
            instructions=INSTRUCTIONS,
            previous_response_id=first.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "42"}],
            tools=RESPONSES_TOOLS,
            stream=True,
        )
        second = None
        async for event in events:
            if event.type == "response.completed":
                second = event.response
        assert second is not None and second.output_text == "The result is 42."
        assert second.previous_response_id == first.id
        assert second.model_dump()["store"] is True
        fetched = await client.responses.retrieve(second.id)
        assert fetched.output_text == "The result is 42." and fetched.id == second.id
        (row,) = gateway.close_session("s1")
        chat = gateway.chat_format(TOOLS)
        await client.responses.delete(first.id)
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(first.id)
    assert row.num_turns == 2 and row.metrics["gateway"]["requests"] == 2
    assert row.metrics["gateway"]["segment_reason"] == "new"  # one segment, extended
    assert [m["role"] for m in row.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert_token_exact(row, chat)
    # The second request's prompt is the first one's transcript plus the template delta.
    first_ids = [*row.prompt_ids, *row.spans[0].ids]
    assert list(model.engine.requests[1].input_ids[: len(first_ids)]) == first_ids


async def test_the_store_is_bounded_and_store_false_keeps_nothing(demo_tokenizer: Any) -> None:
    model = Model(demo_tokenizer, lambda r: "ok")
    config = GatewayConfig(max_stored_responses=2)
    async with served(model, config) as (url, _):
        client = openai.AsyncOpenAI(
            base_url=f"{url}/v1",
            api_key="harness-key",
            default_headers={"X-Toolrollout-Session": "s1"},
            max_retries=0,
        )
        kept = [await client.responses.create(model="m", input=f"q{i}") for i in range(3)]
        unstored = await client.responses.create(model="m", input="q", store=False)
        assert unstored.model_dump()["store"] is False
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(unstored.id)
        with pytest.raises(openai.NotFoundError) as evicted:
            await client.responses.create(model="m", input="more", previous_response_id=kept[0].id)
        assert evicted.value.code == "previous_response_not_found"
        for response in kept[1:]:
            assert (await client.responses.retrieve(response.id)).output_text == "ok"
