"""A /generate waiting on the server keeps its encoded body, not the body's id list.

The list (a Python int per token, about ten times the request's 4-byte array) is only
needed to encode the body; kept alive by the frame that awaits the answer it cost about 40
bytes a prompt token for as long as the server took (benchmarks/bench_inflight_memory.py,
docs/benchmarks.md). The server here is an ``httpx.MockTransport`` handler that holds the
request until the test has looked at the client's heap.
"""

from __future__ import annotations

import gc
from array import array

import anyio
import httpx
from tests.engines.test_sglang_client import answer

from toolrollout.engines._types import GenerateRequest, SamplingParams
from toolrollout.engines.sglang import SGLangClient

FIRST_ID = 777_001
"""An id no other test's list starts with, so the scan finds only this request's."""
LENGTH = 3_000


def id_lists_alive() -> int:
    """Lists on the heap that are this request's ids written out as Python ints."""
    gc.collect()
    return sum(
        1
        for o in gc.get_objects()
        if type(o) is list
        and len(o) == LENGTH
        and o[0] == FIRST_ID
        and o[-1] == FIRST_ID + LENGTH - 1
    )


async def test_a_waiting_request_does_not_keep_its_id_list() -> None:
    arrived = anyio.Event()
    release = anyio.Event()
    seen: list[int] = []

    async def hold(request: httpx.Request) -> httpx.Response:
        seen.append(len(request.content))
        arrived.set()
        await release.wait()
        return answer(request)

    client = SGLangClient("http://s0:30000", transport=httpx.MockTransport(hold))
    request = GenerateRequest(
        input_ids=array("i", range(FIRST_ID, FIRST_ID + LENGTH)),
        sampling=SamplingParams(max_new_tokens=4),
    )
    async with client, anyio.create_task_group() as tg:
        tg.start_soon(client.generate, request)
        await arrived.wait()
        assert seen and seen[0] > LENGTH * 6  # the whole body went out, ids included
        alive = id_lists_alive()
        release.set()
    assert alive == 0
