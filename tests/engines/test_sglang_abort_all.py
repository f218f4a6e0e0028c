"""SGLangClient.abort_all: on shutdown, every request of this client is aborted by its own
rid (never SGLang's server-wide abort_all), and a server that cannot be reached does not
stop the others from being aborted."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import httpx

from toolrollout.engines._types import GenerateRequest, SamplingParams
from toolrollout.engines.sglang import RetryPolicy, SGLangClient

PARTIAL = json.loads(
    (Path(__file__).parent / "fixtures" / "sglang_generate_abort_running.json").read_text()
)


async def test_abort_all_aborts_each_in_flight_request_by_rid() -> None:
    bodies: list[dict[str, object]] = []
    started: set[str] = set()
    aborted = {rid: anyio.Event() for rid in ("a", "b", "c")}
    all_started = anyio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if request.url.path == "/abort_request":
            bodies.append(body)
            if body["rid"] == "c":
                return httpx.Response(503)  # this one's server is in trouble: logged, skipped
            aborted[str(body["rid"])].set()
            return httpx.Response(200)
        started.add(body["rid"])
        if len(started) == 3:
            all_started.set()
        with anyio.move_on_after(1.0):
            await aborted[body["rid"]].wait()
        return httpx.Response(200, json={**PARTIAL, "meta_info": {**PARTIAL["meta_info"]}})

    client = SGLangClient(
        "http://s0:30000",
        transport=httpx.MockTransport(handler),
        retry=RetryPolicy(max_attempts=2, initial_backoff=0.0, jitter=0.0),
    )
    results = {}
    async with client:

        async def run(rid: str) -> None:
            request = GenerateRequest(
                input_ids=(1, 2, 3), sampling=SamplingParams(max_new_tokens=8), rid=rid
            )
            results[rid] = await client.generate(request)

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                for rid in ("a", "b", "c"):
                    tg.start_soon(run, rid)
                await all_started.wait()
                await client.abort_all()
        assert client.stats().in_flight == 0
        await client.abort_all()  # nothing left in flight: no request sent
    assert sorted(str(b["rid"]) for b in bodies) == ["a", "b", "c", "c"]  # c retried once
    assert all("abort_all" not in b for b in bodies)
    assert set(results) == {"a", "b", "c"}
