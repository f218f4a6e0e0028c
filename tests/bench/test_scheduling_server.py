"""The latency-model server's SGLang scheduling semantics (issue 20).

Each expectation is SGLang's, read from its sources (sgl-project/sglang):
``managers/schedule_policy.py`` (``_sort_by_priority_and_fcfs``: sort by
``priority * sign`` then wait-queue entry time, sign -1 unless
``--schedule-low-priority-values-first``; ``preempt_to_schedule``: a running request is
preempted only when the priority difference exceeds
``--priority-scheduling-preemption-threshold``), ``managers/scheduler.py``
(``_set_or_validate_priority``: a missing priority is the lowest; with the feature off a
priority is ignored, or refused with 503 and "Using priority is disabled for this server"
under ``--abort-on-priority-when-disabled``), ``managers/schedule_batch.py``
(``retract_decode``: past the KV budget, the running request with the fewest output tokens is
retracted and later re-prefilled) and ``entrypoints/v1_loads.py`` (``GET /v1/loads``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from tests._latency import lookup
from transformers import AutoTokenizer

from toolrollout.apps.bench import LatencyModel, ServerScheduling, Workload
from toolrollout.apps.bench._metrics import kv_bound_makespan
from toolrollout.apps.bench._model import PRIORITY_DISABLED_MESSAGE
from toolrollout.apps.bench._scheduler import LatencyServer
from toolrollout.apps.bench._server import create_latency_app
from toolrollout.apps.demo import DEMO_MODEL_PATH
from toolrollout.chat import ChatFormat
from toolrollout.engines import GenerateRequest, SamplingParams


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(str(DEMO_MODEL_PATH))


@pytest.fixture(scope="module")
def chat(tokenizer: Any) -> ChatFormat:
    return ChatFormat(tokenizer, tools=[lookup.schema()])


def _server(tokenizer: Any, scheduling: ServerScheduling, **model: Any) -> LatencyServer:
    spec = {"capacity": 1, "prefill_per_token_s": 0.0, "decode_per_token_s": 0.001, **model}
    return LatencyServer(
        tokenizer, LatencyModel(**spec), model_name="latency-model", scheduling=scheduling
    )


def _requests(chat: ChatFormat, count: int, tokens: int = 20) -> list[GenerateRequest]:
    items = Workload(prompts=count, n=1, min_turns=1, max_turns=1, tokens_per_turn=tokens).items
    return [
        GenerateRequest(
            tuple(chat.render_prompt(item.prompt())),
            SamplingParams(max_new_tokens=256),
            rid=f"r{i}",
        )
        for i, item in enumerate(items)
    ]


async def _served_order(
    server: LatencyServer, requests: list[GenerateRequest], priorities: list[int | None]
) -> list[str]:
    """Start request 0 (it takes the one slot), queue the rest, return the service order."""
    first = asyncio.ensure_future(server.generate(requests[0], priority=priorities[0]))
    await asyncio.sleep(0)
    assert server.num_running == 1
    rest = [
        asyncio.ensure_future(server.generate(r, priority=p))
        for r, p in zip(requests[1:], priorities[1:], strict=True)
    ]
    await asyncio.gather(first, *rest)
    log = sorted(server.log, key=lambda e: e["started"])
    return [str(e["priority"]) for e in log]


async def test_priority_orders_the_queue_high_values_first_and_missing_is_lowest(
    tokenizer: Any, chat: ChatFormat
) -> None:
    server = _server(tokenizer, ServerScheduling(enabled=True))
    requests = _requests(chat, 5)
    # 0 runs; then None (lowest), 1, 5, 3 wait; thresholds keep 0 running (diffs <= 10)
    order = await _served_order(server, requests, [0, None, 1, 5, 3])
    assert order == ["0", "5", "3", "1", "None"]
    assert server.preemptions == 0


async def test_low_values_first_flips_the_order_and_ties_keep_arrival_order(
    tokenizer: Any, chat: ChatFormat
) -> None:
    server = _server(tokenizer, ServerScheduling(enabled=True, low_values_first=True))
    requests = _requests(chat, 5)
    order = await _served_order(server, requests, [0, 7, 2, 7, None])
    assert order == ["0", "2", "7", "7", "None"]
    log = sorted(server.log, key=lambda e: e["started"])
    sevens = [e["arrived"] for e in log if e["priority"] == 7]
    assert sevens == sorted(sevens)  # equal priority: first come, first served


async def test_priority_is_ignored_when_disabled(tokenizer: Any, chat: ChatFormat) -> None:
    server = _server(tokenizer, ServerScheduling(enabled=False))
    order = await _served_order(server, _requests(chat, 4), [0, 1, 50, 3])
    assert order == ["0", "1", "50", "3"]  # arrival order, whatever the priorities


async def test_priority_is_refused_with_503_when_disabled_and_abort_requested(
    tokenizer: Any, chat: ChatFormat
) -> None:
    server = _server(tokenizer, ServerScheduling(enabled=False, abort_when_disabled=True))
    transport = httpx.ASGITransport(app=create_latency_app(server))
    ids = list(_requests(chat, 1)[0].input_ids)
    async with httpx.AsyncClient(transport=transport, base_url="http://bench") as http:
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 8}}
        refused = await http.post("/generate", json={**body, "priority": 3})
        plain = await http.post("/generate", json=body)
        info = (await http.get("/server_info")).json()
    assert refused.status_code == 503
    assert refused.json()["error"]["message"] == PRIORITY_DISABLED_MESSAGE
    assert plain.status_code == 200  # without a priority the same request is served
    assert info["enable_priority_scheduling"] is False
    assert info["abort_on_priority_when_disabled"] is True
    assert info["priority_scheduling_preemption_threshold"] == 10


async def test_preemption_needs_a_priority_gap_above_the_threshold(
    tokenizer: Any, chat: ChatFormat
) -> None:
    server = _server(
        tokenizer, ServerScheduling(enabled=True, preemption_threshold=10), decode_per_token_s=0.01
    )
    requests = _requests(chat, 3, tokens=40)  # 0.4 s each: the checks below fall inside it
    running = asyncio.ensure_future(server.generate(requests[0], priority=0))
    await asyncio.sleep(0)
    close = asyncio.ensure_future(server.generate(requests[1], priority=10))
    await asyncio.sleep(0.005)
    assert server.num_running == 1 and server.num_waiting == 1  # a gap of 10 is not enough
    urgent = asyncio.ensure_future(server.generate(requests[2], priority=11))
    await asyncio.sleep(0.005)
    assert server.preemptions == 1  # 11 - 0 > 10: the running request gave way
    results = await asyncio.gather(running, close, urgent)
    assert all(r.finish_reason.type == "stop" for r in results)  # the preempted one too
    entries = {e["priority"]: e for e in server.log}
    assert entries[0]["preemptions"] == 1
    assert entries[11]["ended"] < entries[0]["ended"]


async def test_kv_budget_retracts_the_shortest_decode_and_it_still_finishes(
    tokenizer: Any, chat: ChatFormat
) -> None:
    requests = _requests(chat, 3, tokens=120)
    prompt = len(requests[0].input_ids)
    # room for the three prompts and a little decode, not for three full answers
    budget = 3 * prompt + 150
    server = _server(
        tokenizer,
        ServerScheduling(),
        capacity=3,
        kv_tokens=budget,
        decode_per_token_s=0.0005,
    )
    server.new_token_ratio = 0.0  # admit on the prompt alone, as a fresh SGLang server may
    results = await asyncio.gather(*(server.generate(r) for r in requests))
    assert server.retractions >= 1
    assert all(r.finish_reason.type == "stop" for r in results)
    assert [len(r.output_ids) for r in results] == [len(results[0].output_ids)] * 3
    assert sum(e["retractions"] for e in server.log) == server.retractions
    assert server.used_tokens() <= budget
    # the KV bound holds on this server, with the budget it really keeps between checks
    started = min(e["arrived"] for e in server.log)
    makespan = max(e["ended"] for e in server.log) - started
    kept = budget + server.model.kv_overshoot_tokens
    assert server.model.kv_overshoot_tokens == 3 * 20  # 3 slots, a check every 10 ms
    assert 0 < kv_bound_makespan(server.log, 0.0005, kept) <= makespan


async def test_v1_loads_reports_sglangs_fields(tokenizer: Any, chat: ChatFormat) -> None:
    server = _server(tokenizer, ServerScheduling(), capacity=1, kv_tokens=100_000)
    transport = httpx.ASGITransport(app=create_latency_app(server))
    requests = _requests(chat, 2, tokens=60)
    async with httpx.AsyncClient(transport=transport, base_url="http://bench") as http:
        tasks = [asyncio.ensure_future(server.generate(r)) for r in requests]
        await asyncio.sleep(0.005)
        body = (await http.get("/v1/loads")).json()
        core = (await http.get("/v1/loads", params={"include": "core"})).json()
        await asyncio.gather(*tasks)
    load = body["loads"][0]
    assert set(body) >= {"timestamp", "version", "loads"}
    assert load["num_running_reqs"] == 1 and load["num_waiting_reqs"] == 1
    assert load["max_total_num_tokens"] == 100_000 and load["max_running_requests"] == 1
    assert 0 < load["num_used_tokens"] <= load["num_total_tokens"]
    assert load["token_usage"] == pytest.approx(load["num_used_tokens"] / 100_000)
    assert load["queues"]["waiting"] == 1
    assert "queues" not in core["loads"][0]


async def test_group_prompt_is_cached_per_server(tokenizer: Any, chat: ChatFormat) -> None:
    workload = Workload(prompts=1, n=2, min_turns=1, max_turns=1, shared_prompt_words=200)
    first, second = (
        GenerateRequest(tuple(chat.render_prompt(item.prompt())), SamplingParams(64))
        for item in workload.items
    )
    shared = len(chat.render_prompt([{"role": "user", "content": workload.items[0].shared}]))
    one = _server(tokenizer, ServerScheduling(), capacity=4)
    other = _server(tokenizer, ServerScheduling(), capacity=4)
    cold = await one.generate(first)
    warm = await one.generate(second)
    elsewhere = await other.generate(second)
    assert cold.cached_tokens == 0
    assert warm.cached_tokens >= shared - 8  # the group's problem text, prefilled once
    assert elsewhere.cached_tokens == 0  # another server's cache never saw the group


async def test_v1_loads_leaves_the_evictable_cache_out_of_the_usage(
    tokenizer: Any, chat: ChatFormat
) -> None:
    """SGLang counts ``max_total - (available + evictable)`` as used: a finished request's
    cached context is evictable, so an idle server with a full cache reports no usage."""
    server = _server(tokenizer, ServerScheduling(), capacity=2, kv_tokens=100_000)
    requests = _requests(chat, 2, tokens=60)
    await asyncio.gather(*(server.generate(r) for r in requests))
    assert server.used_tokens() > 0  # the two contexts stay in the prefix cache
    assert server.running_tokens() == 0
    load = server.load()
    assert load["num_running_reqs"] == 0
    assert load["num_used_tokens"] == 0 and load["token_usage"] == 0.0
