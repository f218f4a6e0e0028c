"""OpenAI Chat Completions through the gateway, driven by the official ``openai`` SDK.

The SDK talks to the app in-process (``httpx.ASGITransport``) except where a real socket
is needed (a client disconnecting), where uvicorn serves it on a loopback port in the
test's own event loop.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

import httpx
import openai
import pytest

from toolrollout.apps.gateway import Gateway, GatewayConfig, build_app

from .conftest import TOOLS, Model, assert_token_exact, call_text, served

SYSTEM = {"role": "system", "content": "You are a careful calculator assistant."}


def answers(request: Any, tokenizer: Any) -> str:
    text = tokenizer.decode(list(request.input_ids))
    if text.rstrip().endswith("</tool_response><|im_end|>\n<|im_start|>assistant"):
        return "The result is 42."
    return call_text("6*7")


@asynccontextmanager
async def sdk(
    model: Model, *, config: GatewayConfig | None = None, session: str = "session-a"
) -> AsyncIterator[tuple[Any, Gateway, httpx.AsyncClient]]:
    # The SDK's client is yielded as Any: its overloads want TypedDict messages, and these
    # tests build plain dicts (what a harness sends); openai 3.x types http_client as httpx2's.
    async with Gateway(model.engine, model.tokenizer, config=config) as gateway:
        transport = httpx.ASGITransport(app=build_app(gateway))
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as http:
            client = openai.AsyncOpenAI(
                base_url=f"http://gw/s/{session}/v1",
                api_key="harness-key",
                http_client=cast(Any, http),
                max_retries=0,
            )
            yield client, gateway, http


async def test_an_sdk_agent_runs_and_is_recorded(demo_tokenizer: Any) -> None:
    model = Model(demo_tokenizer, lambda r: answers(r, demo_tokenizer))
    async with sdk(model) as (client, gateway, http):
        messages: list[Any] = [SYSTEM, {"role": "user", "content": "What is 6*7?"}]
        for _ in range(3):  # the usual agent loop: call tools until the model answers
            reply = await client.chat.completions.create(
                model="any", messages=messages, tools=list(TOOLS), tool_choice="auto"
            )
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                assert json.loads(call.function.arguments) == {"expression": "6*7"}
                messages.append({"role": "tool", "tool_call_id": call.id, "content": "42"})
        assert reply.choices[0].finish_reason == "stop"
        assert message.content == "The result is 42."
        assert reply.usage is not None and reply.usage.completion_tokens > 0
        assert [m.id for m in (await client.models.list()).data] == ["toolrollout"]
        assert (await http.post("/v1/sessions/session-a/reward", json={"reward": 1})).is_success
        closed = (await http.post("/v1/sessions/session-a/close", json={})).json()
        (row,) = gateway.records("session-a")
        chat = gateway.chat_format(TOOLS)
    assert closed["rows"] == [
        {"uid": row.uid, "segment": 0, "segment_reason": "new", "num_turns": 2, "reward": 1.0}
    ]
    assert_token_exact(row, chat)


async def test_streaming_sends_openai_chunks(demo_tokenizer: Any) -> None:
    model = Model(demo_tokenizer, lambda r: answers(r, demo_tokenizer))
    async with sdk(model) as (client, gateway, _):
        messages: list[Any] = [SYSTEM, {"role": "user", "content": "What is 6*7?"}]
        stream = await client.chat.completions.create(
            model="m",
            messages=messages,
            tools=list(TOOLS),
            stream=True,
            stream_options={"include_usage": True},
        )
        calls: dict[int, dict[str, str]] = {}
        finish, usage = None, None
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                finish = choice.finish_reason or finish
                for delta in choice.delta.tool_calls or ():
                    slot = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                    slot["id"] += delta.id or ""
                    slot["name"] += delta.function.name or "" if delta.function else ""
                    slot["arguments"] += delta.function.arguments or "" if delta.function else ""
        assert finish == "tool_calls" and usage is not None and usage.total_tokens > 0
        (call,) = calls.values()
        assert call["name"] == "calculator" and json.loads(call["arguments"])["expression"]
        messages += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": call["name"], "arguments": call["arguments"]},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call["id"], "content": "42"},
        ]
        final = await client.chat.completions.create(
            model="m", messages=messages, tools=list(TOOLS), stream=True
        )
        text = "".join([c.choices[0].delta.content or "" async for c in final if c.choices])
        assert text == "The result is 42."
        (row,) = gateway.close_session("session-a")
    assert row.num_turns == 2  # the streamed turn, sent back, extended the segment


async def test_n_choices(demo_tokenizer: Any) -> None:
    model = Model(demo_tokenizer, lambda r: "ok")
    async with sdk(model) as (client, _, _):
        reply = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], n=3
        )
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert len(model.engine.requests) == 3


async def test_n_choices_stream_each_choice_whole(demo_tokenizer: Any) -> None:
    model = Model(demo_tokenizer, lambda r: "ok")
    async with sdk(model) as (client, _, _):
        stream = await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hi"}],
            n=2,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    deltas = [
        (c.index, c.delta.role, c.delta.content, c.finish_reason) for k in chunks for c in k.choices
    ]
    assert deltas == [
        (0, "assistant", "", None), (0, None, "ok", None), (0, None, None, "stop"),
        (1, "assistant", "", None), (1, None, "ok", None), (1, None, None, "stop"),
    ]  # fmt: skip
    assert chunks[-1].choices == [] and chunks[-1].usage is not None


async def test_context_overflow_is_openais_error(demo_tokenizer: Any) -> None:
    model = Model(demo_tokenizer, lambda r: "ok")
    config = GatewayConfig(context_length=64)
    async with sdk(model, config=config) as (client, gateway, http):
        long = [{"role": "user", "content": "nine " * 200}]
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(model="m", messages=long)
        raw = await http.post(
            "/v1/chat/completions",
            json={"messages": long},
            headers={"x-toolrollout-session": "session-a"},
        )
        assert gateway.sessions()["session-a"]["errors"] == {"context_length_exceeded": 2}
    assert caught.value.code == "context_length_exceeded"
    assert raw.status_code == 400
    error = raw.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "messages"
    assert error["message"].startswith("This model's maximum context length is 64 tokens")
    assert not model.engine.requests


async def test_sessions_are_named_by_header_path_or_key(demo_tokenizer: Any) -> None:
    """A header or path names a session; a harness's key names one by its keyed hash (the
    same for the same key, across both headers that carry it), never by itself."""
    model = Model(demo_tokenizer, lambda r: "ok")
    body = {"messages": [{"role": "user", "content": "hi"}]}
    async with sdk(model) as (_, gateway, http):
        await http.post("/v1/chat/completions", json=body, headers={"authorization": "Bearer k1"})
        await http.post("/v1/chat/completions", json=body, headers={"x-api-key": "k2"})
        await http.post("/v1/chat/completions", json=body, headers={"authorization": "Bearer k2"})
        await http.post(
            "/v1/chat/completions",
            json=body,
            headers={"x-toolrollout-session": "h1", "x-api-key": "k2"},
        )
        await http.post("/s/p%201/v1/chat/completions", json=body)
        await http.post(
            "/v1/chat/completions", json=body, headers={"x-toolrollout-group": "task-7"}
        )
        named = set(gateway.sessions())
        hashed = named - {"h1", "p 1", "default"}
        assert len(named) == 5 and len(hashed) == 2 and "k1" not in named and "k2" not in named
        assert all(name.startswith("key-") and len(name) == 28 for name in hashed)
        k2 = (await http.get("/v1/sessions", headers={"x-api-key": "k2"})).json()["sessions"]
        (k2_name,) = k2
        assert k2[k2_name]["requests"] == 2 and k2_name in hashed
        (row,) = gateway.close_session("default")
    assert row.group_id == "task-7"


async def test_a_full_gateway_answers_429(demo_tokenizer: Any) -> None:
    model = Model(demo_tokenizer, lambda r: "ok", delay=0.3)
    config = GatewayConfig(max_concurrency=1, max_waiting=1)
    async with sdk(model, config=config) as (client, _, _):
        calls = [
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": str(i)}]
            )
            for i in range(3)
        ]
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
    refused = [o for o in outcomes if isinstance(o, openai.RateLimitError)]
    assert len(refused) == 1 and len(model.engine.requests) == 2


async def test_a_slow_answer_times_out_and_is_aborted(demo_tokenizer: Any) -> None:
    model = Model(demo_tokenizer, lambda r: "ok", delay=5.0)
    config = GatewayConfig(request_timeout=0.2)
    async with sdk(model, config=config) as (client, gateway, _):
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x"}]
            )
        assert gateway.sessions()["session-a"]["model_turns"] == 0
    assert caught.value.status_code == 504
    assert model.engine.aborted == [model.engine.requests[0].rid]


async def test_a_client_disconnect_aborts_the_generation(demo_tokenizer: Any) -> None:
    model = Model(demo_tokenizer, lambda r: "ok", delay=10.0)
    async with served(model) as (url, gateway):
        async with httpx.AsyncClient(base_url=url) as http:
            with pytest.raises(httpx.ReadTimeout):
                await http.post(
                    "/v1/chat/completions",
                    json={"messages": [{"role": "user", "content": "x"}]},
                    timeout=0.3,
                )
        for _ in range(200):
            if model.engine.aborted:
                break
            await asyncio.sleep(0.01)
        assert model.engine.aborted == [model.engine.requests[0].rid]
        assert gateway.sessions()["default"]["model_turns"] == 0
