"""A /generate waiting on the server keeps its encoded body, not the body's id list.

The list (a Python int per token, about ten times the request's 4-byte array) is only
needed to encode the body; kept alive by the frame that awaits the answer it cost about 40
bytes a prompt token for as long as the server took (benchmarks/bench_inflight_memory.py,
docs/benchmarks.md). The server here is an ``httpx.MockTransport`` handler that holds the
request until the test has looked at the client's heap.
"""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from array import array
from dataclasses import replace

import anyio
import httpx
from aiohttp import web
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


ANSWER = {
    "text": "",
    "output_ids": [1],
    "meta_info": {
        "id": "x",
        "finish_reason": {"type": "length", "length": 1},
        "prompt_tokens": 1,
        "completion_tokens": 1,
        "cached_tokens": 0,
        "output_token_logprobs": [[-0.5, 1, None]],
        "weight_version": "default",
    },
}


async def test_over_aiohttp_a_waiting_request_lets_go_of_its_sent_body() -> None:
    """Over the default transport the encoded body (6.4 bytes a token) goes once written:
    a loopback aiohttp server reads and drops it, then holds the answer while the test
    reads the client's traced memory."""
    arrived = asyncio.Event()
    release = asyncio.Event()
    sizes: list[int] = []

    async def generate(request: web.Request) -> web.Response:
        size = 0  # read in pieces and kept nowhere (request.read() would keep a copy)
        while chunk := await request.content.readany():
            size += len(chunk)
        sizes.append(size)
        arrived.set()
        await release.wait()
        return web.json_response(ANSWER)

    app = web.Application(client_max_size=2**26)
    app.add_routes([web.post("/generate", generate)])
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    length = 100_000
    request = GenerateRequest(
        input_ids=array("i", range(FIRST_ID, FIRST_ID + length)),
        sampling=SamplingParams(max_new_tokens=1),
    )
    try:
        async with SGLangClient(f"http://127.0.0.1:{port}") as client:
            release.set()
            await client.generate(replace(request, input_ids=array("i", [1])))  # warm up
            release.clear()
            arrived.clear()
            gc.collect()
            tracemalloc.start()
            try:
                before = tracemalloc.get_traced_memory()[0]
                async with anyio.create_task_group() as tg:
                    tg.start_soon(client.generate, request)
                    await arrived.wait()
                    await anyio.sleep(0.1)
                    gc.collect()
                    held = tracemalloc.get_traced_memory()[0] - before
                    release.set()
            finally:
                tracemalloc.stop()
    finally:
        await runner.cleanup()
    body = sizes[-1]
    assert body > 6 * length  # the whole body went out
    assert held < body / 4, (held, body)
