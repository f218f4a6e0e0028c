"""Priority scheduling on the real SGLang server (sglang 0.5.23), as toolrollout uses it.

toolrollout's ``priority``, ``history`` and ``oldest`` policies (docs/scheduling.md) set
:attr:`GenerateRequest.priority` only for servers whose ``/server_info`` reports
``enable_priority_scheduling``, and keep the priorities of one run within the server's
``priority_scheduling_preemption_threshold`` so that the queue is reordered and nothing
running is preempted. SGLang applies priorities only when started with
``--enable-priority-scheduling`` and the ``fcfs`` (default) or ``lof`` schedule policy
(``arg_groups/validation_hook.py``); by default a higher value is served first, and a
waiting request preempts a running one whose priority is lower by more than the
threshold (``schedule_policy.py``, ``preempt_to_schedule``).

The server here runs one request at a time (``--max-running-requests 1``), so that later
requests wait in its queue and the order they are served in is visible.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import anyio
import pytest

from tests.real_engines.sglang._launch import LIMIT, SGLangServer
from tests.real_engines.sglang._prompts import chat_ids
from toolrollout.engines import GenerateRequest, SamplingParams, SchedulingConfig, SGLangClient
from toolrollout.engines._priority import ServerPriority
from toolrollout.engines._scheduling import Scheduler

pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(LIMIT)]

BLOCKER = 400  # tokens the running request decodes while the others queue (context 1024)


@pytest.fixture(scope="module")
def one_slot(
    start_sglang: Callable[..., AbstractContextManager[SGLangServer]],
) -> Iterator[SGLangServer]:
    """A priority-scheduling server that runs one request at a time."""
    flags = ("--enable-priority-scheduling", "--max-running-requests", "1")
    with start_sglang(extra_args=flags) as server:
        yield server


def request(name: str, priority: int, max_new_tokens: int) -> GenerateRequest:
    return GenerateRequest(
        input_ids=chat_ids(f"Tell me about {name}."),
        sampling=SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True),
        rid=name,
        priority=priority,
    )


async def until_load(client: SGLangClient, *, running: int, waiting: int) -> None:
    """Wait until ``/v1/loads`` shows this many requests running and waiting."""
    with anyio.fail_after(120):
        while True:
            (load,) = (await client.get_loads())["loads"]
            if (load["num_running_reqs"], load["num_waiting_reqs"]) == (running, waiting):
                return
            await anyio.sleep(0.05)


async def finishing_order(
    client: SGLangClient,
    blocker: GenerateRequest,
    queued: list[GenerateRequest],
    *,
    queue: bool = True,
) -> list[str]:
    """The rids in the order they finish: ``blocker`` running, then ``queued`` sent one
    after another, each once the one before is waiting on the server (with ``queue``)."""
    order: list[str] = []

    async def run(item: GenerateRequest) -> None:
        result = await client.generate(item)
        assert result.finish_reason.type == "length", (item.rid, result.finish_reason)
        order.append(str(item.rid))

    async with anyio.create_task_group() as tg:
        tg.start_soon(run, blocker)
        await until_load(client, running=1, waiting=0)
        for count, item in enumerate(queued, start=1):
            tg.start_soon(run, item)
            if queue:
                await until_load(client, running=1, waiting=count)
    return order


async def test_the_server_reports_what_the_scheduler_reads(one_slot: SGLangServer) -> None:
    async with SGLangClient(one_slot.url) as client:
        server = await client.server_info()
        found = await Scheduler(SchedulingConfig(priority=True), client).server_priority()
    assert server["max_running_requests"] == 1
    assert found == ServerPriority(True, low_values_first=False, preemption_threshold=10)


async def test_the_queue_is_served_highest_priority_first(one_slot: SGLangServer) -> None:
    """Priorities within the threshold of the running request reorder the queue only."""
    async with SGLangClient(one_slot.url) as client:
        order = await finishing_order(
            client,
            request("blocker", 5, BLOCKER),
            [request("low", 0, 4), request("middle", 3, 4), request("high", 9, 4)],
        )
    assert order == ["blocker", "high", "middle", "low"]


async def test_a_priority_above_the_threshold_preempts_the_running_request(
    one_slot: SGLangServer,
) -> None:
    async with SGLangClient(one_slot.url) as client:
        order = await finishing_order(
            client, request("running", 0, BLOCKER), [request("urgent", 11, 4)], queue=False
        )
    assert order == ["urgent", "running"]
