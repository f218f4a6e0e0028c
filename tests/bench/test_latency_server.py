"""The latency-model server: SGLang wire shapes, scripted tool turns, cache, abort, capacity.

Driven in-process through httpx's ASGI transport with toolrollout's own SGLangClient and
RolloutRunner, so the scripted turns go through the real parser, deltas and drift check.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest
from tests._latency import lookup
from transformers import AutoTokenizer

from toolrollout.apps.bench import LatencyModel, ToolLatency, Workload
from toolrollout.apps.bench._scheduler import LatencyServer
from toolrollout.apps.bench._script import TOOL_NAME, TurnScript
from toolrollout.apps.bench._server import create_latency_app
from toolrollout.apps.bench._tools import create_tool_app
from toolrollout.apps.demo import DEMO_MODEL_PATH
from toolrollout.chat import ChatFormat
from toolrollout.chat.parsers import get_tool_parser
from toolrollout.engines import GenerateRequest, SamplingParams, SGLangClient
from toolrollout.rollout import RolloutConfig, RolloutRunner


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(str(DEMO_MODEL_PATH))


def _server(tokenizer: Any, **kw: Any) -> LatencyServer:
    model = LatencyModel(
        **{"capacity": 64, "prefill_per_token_s": 0.0, "decode_per_token_s": 0.0, **kw}
    )
    return LatencyServer(tokenizer, model, model_name="latency-model")


@pytest.fixture
async def http(tokenizer: Any) -> AsyncIterator[tuple[LatencyServer, httpx.AsyncClient]]:
    server = _server(tokenizer)
    transport = httpx.ASGITransport(app=create_latency_app(server))
    async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
        yield server, client


def test_scripted_turns_parse_and_token_ids_come_from_the_tokenizer(tokenizer: Any) -> None:
    script = TurnScript(tokenizer)
    assert script.im_end == tokenizer.convert_tokens_to_ids("<|im_end|>")
    chat = ChatFormat(tokenizer, tools=[lookup.schema()])
    parser = get_tool_parser("qwen25")
    item = Workload(prompts=1, n=1, min_turns=3, max_turns=3, tokens_per_turn=40).items[0]
    first = script.turn(item, 0)
    ids = script.output_ids(first)
    assert ids[-1] == script.im_end
    assert 30 <= len(ids) <= 50  # about tokens_per_turn
    parsed = parser.parse(chat.model_text(ids))
    assert [c.name for c in parsed.tool_calls] == [TOOL_NAME]
    assert parsed.tool_calls[0].arguments == {"key": f"{item.key}.0"}
    last = script.turn(item, item.turns - 1)
    assert not parser.parse(chat.model_text(script.output_ids(last))).tool_calls


def test_locate_reads_the_script_and_counts_finished_turns(tokenizer: Any) -> None:
    script = TurnScript(tokenizer)
    chat = ChatFormat(tokenizer, tools=[lookup.schema()])
    item = Workload(prompts=1, n=1, min_turns=4, max_turns=4).items[0]
    messages: list[dict[str, Any]] = list(item.prompt())
    ids = chat.render_prompt(messages)
    for turn in range(3):
        found, index, _ = script.locate(ids)
        assert found == item and index == turn
        out = script.output_ids(script.turn(item, turn))
        ids += out
        call = get_tool_parser("qwen25").parse(chat.model_text(out)).tool_calls[0]
        messages.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments},
                    }
                ],
            }
        )
        tool = {"role": "tool", "tool_call_id": call.id, "content": "record"}
        ids += chat.tool_turn_delta(messages, [tool])
        messages.append(tool)
    assert script.locate(ids)[1] == 3
    assert script.locate(chat.render_prompt([{"role": "user", "content": "hi"}]))[0] is None


async def test_generate_answers_in_sglangs_shape(
    http: tuple[LatencyServer, httpx.AsyncClient], tokenizer: Any
) -> None:
    server, client = http
    chat = ChatFormat(tokenizer, tools=[lookup.schema()])
    item = Workload(prompts=1, n=1, min_turns=2, max_turns=2).items[0]
    ids = chat.render_prompt(item.prompt())
    body = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": 200},
        "return_logprob": True,
        "rid": "r1",
    }
    response = await client.post("/generate", json=body)
    assert response.status_code == 200
    data = response.json()
    meta = data["meta_info"]
    assert meta["id"] == "r1"
    assert meta["finish_reason"] == {"type": "stop", "matched": server.script.im_end}
    assert meta["prompt_tokens"] == len(ids)
    assert [e[1] for e in meta["output_token_logprobs"]] == data["output_ids"]
    assert data["text"] == tokenizer.decode(data["output_ids"])
    # max_new_tokens cuts the scripted turn: finish_reason length
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 3}}
    short = (await client.post("/generate", json=body)).json()
    assert len(short["output_ids"]) == 3
    assert short["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
    # one-line errors for what this server does not do
    bad = await client.post("/generate", json={"text": "hello"})
    assert bad.status_code == 400 and "input_ids" in bad.json()["error"]["message"]
    assert len(server.log) == 2


async def test_rollouts_through_sglang_client_complete_with_cache_hits(tokenizer: Any) -> None:
    server = _server(tokenizer)
    transport = httpx.ASGITransport(app=create_latency_app(server))
    workload = Workload(prompts=2, n=3, min_turns=2, max_turns=4, tokens_per_turn=32, seed=7)
    async with SGLangClient("http://bench", transport=transport) as client:
        runner = RolloutRunner(
            client,
            tokenizer,
            [lookup],
            config=RolloutConfig(sampling=SamplingParams(max_new_tokens=96), max_turns=8),
        )
        trajectories = await runner.run(workload.rows())
    by_key = {item.key: item for item in workload.items}
    assert len(trajectories) == workload.trajectories
    for trajectory in trajectories:
        key = trajectory.messages[0]["content"].split()[1]
        assert str(trajectory.status) == "completed", trajectory.error
        assert trajectory.num_turns == by_key[key].turns
        assert trajectory.num_tool_calls == by_key[key].turns - 1
        assert trajectory.metrics["drift_mismatches"] == 0
        if trajectory.num_turns > 1:  # later turns reuse the trajectory's cached prefix
            assert trajectory.metrics["cached_tokens"] > 0
    assert len(server.log) == sum(t.num_turns for t in trajectories)


async def test_a_shared_prompts_samples_each_run_their_own_script(tokenizer: Any) -> None:
    """Grouped: n samples of one prompt, told apart by the server as sampling would."""
    server = _server(tokenizer)
    transport = httpx.ASGITransport(app=create_latency_app(server))
    workload = Workload(
        prompts=3, n=4, min_turns=1, max_turns=5, tokens_per_turn=24, seed=3, grouped=True
    )
    groups = workload.groups()
    assert any(len(set(group.turns)) > 1 for group in groups)  # samples differ in a group
    async with SGLangClient("http://bench", transport=transport) as client:
        runner = RolloutRunner(
            client,
            tokenizer,
            [lookup],
            config=RolloutConfig(
                sampling=SamplingParams(max_new_tokens=96), max_turns=8, n=workload.n
            ),
        )
        trajectories = await runner.run(workload.prompt_rows())
    assert len(trajectories) == workload.trajectories
    for prompt_index, group in enumerate(groups):
        runs = [t for t in trajectories if t.prompt_index == prompt_index]
        assert len({t.group_id for t in runs}) == 1
        assert all(str(t.status) == "completed" for t in runs), [t.error for t in runs]
        assert all(t.metrics["drift_mismatches"] == 0 for t in runs)
        # the group's samples ran every sample's script once, whichever copy ran which
        assert sorted(t.num_turns for t in runs) == sorted(group.turns)
    keys = {row["key"] for row in server.log}
    assert keys == {item.key for item in workload.items}
    by_key = {item.key: item for item in workload.items}
    for key in keys:  # each sample's turns were read back from its first answer
        assert sorted(r["turn"] for r in server.log if r["key"] == key) == list(
            range(by_key[key].turns)
        )
    server.reset()  # a new mode draws from sample 0 again
    ids = ChatFormat(tokenizer, tools=[lookup.schema()]).render_prompt(groups[0].prompt())
    assert server.script.locate(ids)[0] == groups[0]  # a first turn: not drawn yet
    assert await server.draw(groups[0]) == groups[0].sample(0)
    assert await server.draw(groups[0]) == groups[0].sample(1)


async def test_several_servers_draw_a_groups_samples_from_one_counter(tokenizer: Any) -> None:
    """A group's copies spread over two servers still run each sample once: the servers
    count first turns at the tool service (``/bench/draw``), not each on its own."""
    tools = httpx.ASGITransport(app=create_tool_app(ToolLatency("fixed", median=0.0)))
    group = Workload(prompts=1, n=4, min_turns=1, max_turns=6, seed=1, grouped=True).groups()[0]
    async with httpx.AsyncClient(transport=tools, base_url="http://tools") as draws:
        servers = [
            LatencyServer(tokenizer, LatencyModel(), model_name="m", draw_url="http://tools",
                          draw_client=draws)
            for _ in range(2)
        ]  # fmt: skip
        drawn = [await servers[i % 2].draw(group) for i in range(4)]
        assert drawn == [group.sample(i) for i in range(4)]
        alone = LatencyServer(tokenizer, LatencyModel(), model_name="m")
        assert [await alone.draw(group) for _ in range(2)] == [group.sample(0), group.sample(1)]
        await draws.post("/bench/reset")
        assert await servers[1].draw(group) == group.sample(0)
        bad = await draws.post("/bench/draw", json={"group": "p0", "samples": 0})
        assert bad.status_code == 400


async def test_capacity_queues_requests_and_the_log_records_slot_time(tokenizer: Any) -> None:
    server = _server(tokenizer, capacity=2, decode_per_token_s=0.002)
    chat = ChatFormat(tokenizer, tools=[lookup.schema()])
    items = Workload(prompts=4, n=1, min_turns=1, max_turns=1, tokens_per_turn=20).items
    transport = httpx.ASGITransport(app=create_latency_app(server))
    async with SGLangClient("http://bench", transport=transport) as client:
        async with anyio.create_task_group() as tg:
            for item in items:
                request = GenerateRequest(
                    tuple(chat.render_prompt(item.prompt())), SamplingParams(max_new_tokens=64)
                )
                tg.start_soon(client.generate, request)
    assert len(server.log) == 4
    for entry in server.log:
        expected = entry["output_tokens"] * 0.002
        assert entry["slot_seconds"] >= expected * 0.9
    # two slots: never more than two requests hold one at a time, and the third request
    # got its slot only when an earlier one had ended
    log = sorted(server.log, key=lambda e: e["started"])
    for entry in log:
        holding = [o for o in log if o["started"] <= entry["started"] < o["ended"]]
        assert len(holding) <= 2
    assert log[2]["started"] >= min(log[0]["ended"], log[1]["ended"])


async def test_abort_returns_the_partial_turn(tokenizer: Any) -> None:
    server = _server(tokenizer, decode_per_token_s=0.05)
    chat = ChatFormat(tokenizer, tools=[lookup.schema()])
    item = Workload(prompts=1, n=1, min_turns=2, max_turns=2, tokens_per_turn=40).items[0]
    transport = httpx.ASGITransport(app=create_latency_app(server))
    async with SGLangClient("http://bench", transport=transport) as client:
        request = GenerateRequest(
            tuple(chat.render_prompt(item.prompt())),
            SamplingParams(max_new_tokens=64),
            rid="slow-1",
        )
        results = []

        async def run() -> None:
            results.append(await client.generate(request))

        started = time.perf_counter()
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await anyio.sleep(0.3)
            await client.abort("slow-1")
    assert time.perf_counter() - started < 1.5  # a full turn would take about 2 s
    result = results[0]
    assert result.finish_reason.type == "abort"
    assert 0 < len(result.output_ids) < 40
    assert server.log[-1]["finish"] == "abort"


async def test_openai_chat_route_returns_parsed_tool_calls(
    http: tuple[LatencyServer, httpx.AsyncClient],
) -> None:
    _, client = http
    item = Workload(prompts=1, n=1, min_turns=2, max_turns=2).items[0]
    body = {
        "model": "latency-model",
        "messages": item.prompt(),
        "tools": [lookup.schema()],
        "max_tokens": 200,
    }
    data = (await client.post("/v1/chat/completions", json=body)).json()
    choice = data["choices"][0]
    assert data["object"] == "chat.completion"
    assert choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == TOOL_NAME
    assert json.loads(call["function"]["arguments"]) == {"key": f"{item.key}.0"}
    # the tool result comes back as an OpenAI tool message; the script's last turn answers
    messages = [
        *item.prompt(),
        choice["message"],
        {"role": "tool", "tool_call_id": call["id"], "content": "record"},
    ]
    body["messages"] = messages
    final = (await client.post("/v1/chat/completions", json=body)).json()["choices"][0]
    assert final["finish_reason"] == "stop"
    assert final["message"]["tool_calls"] is None
    assert item.key in final["message"]["content"]
    refused = await client.post("/v1/chat/completions", json={**body, "stream": True})
    assert refused.status_code == 400
    assert "stream" in refused.json()["error"]["message"]


class _ByHost(httpx.AsyncBaseTransport):
    """Two in-process servers behind one client transport, chosen by the URL's host."""

    def __init__(self, apps: dict[str, Any]) -> None:
        self.transports = {host: httpx.ASGITransport(app=app) for host, app in apps.items()}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self.transports[request.url.host].handle_async_request(request)


async def test_two_servers_sticky_routing_keeps_each_trajectorys_cache(tokenizer: Any) -> None:
    servers = {"a": _server(tokenizer), "b": _server(tokenizer)}
    transport = _ByHost({host: create_latency_app(s) for host, s in servers.items()})
    workload = Workload(prompts=4, n=2, min_turns=3, max_turns=3, tokens_per_turn=24, seed=2)
    async with SGLangClient(["http://a", "http://b"], transport=transport) as client:
        runner = RolloutRunner(
            client,
            tokenizer,
            [lookup],
            config=RolloutConfig(sampling=SamplingParams(max_new_tokens=64), max_turns=4),
        )
        trajectories = await runner.run(workload.rows())
    assert all(str(t.status) == "completed" for t in trajectories)
    # least-outstanding choice spreads new trajectories over both servers ...
    served = {host: {e["key"] for e in s.log} for host, s in servers.items()}
    assert served["a"] and served["b"]
    # ... and every turn of a trajectory stays on the server that served its first turn
    assert not served["a"] & served["b"]
    for s in servers.values():
        previous: dict[str, dict[str, Any]] = {}
        for entry in sorted(s.log, key=lambda e: (e["key"], e["turn"])):
            before = previous.get(entry["key"])
            if before is not None:  # the whole earlier turn is a cache hit
                assert entry["cached_tokens"] == before["prompt_tokens"] + before["output_tokens"]
            previous[entry["key"]] = entry
    for t in trajectories:  # reported per trajectory
        assert t.metrics["cached_tokens"] > 0
