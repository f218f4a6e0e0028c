"""What a request waiting on the server costs the client, per prompt token (issue 20).

The scale benchmark (``bench_scale.py``) holds its trajectories against an in-process
engine at the engine seam, so it never sees what an HTTP request keeps alive while the
server works on it. This one sends requests through ``SGLangClient`` to a server (its own
process, so its buffers are not counted) that reads each request and answers only when
told, and measures the resident memory the client adds while every request waits, in one
wave in a fresh process (a second wave would reuse the first one's freed memory and show
less than it holds). The requests' id arrays exist before the wave: what is measured is
what being in flight adds, connections included.

It prints, per prompt token of a waiting request, the bytes added next to the bound: the
JSON body itself, which the transport holds until the answer comes. (tracemalloc is not
used: orjson reserves far more than it writes, address space the kernel never backs.)
Given several prompt lengths (``--tokens 500,2000,8000``), it measures each in its own
process and splits what a waiting request holds into a part per request (connection,
task, response machinery) and a part per prompt token (least squares over the lengths).

    python benchmarks/bench_inflight_memory.py [--requests 200] [--tokens 2000]
    python benchmarks/bench_inflight_memory.py --tokens 500,2000,8000
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import subprocess
import sys
from array import array
from pathlib import Path
from typing import Any

import anyio
import httpx

from toolrollout._net import free_port, stop_popen
from toolrollout.apps.bench._harness import _wait_healthy
from toolrollout.engines import GenerateRequest, SamplingParams, SGLangClient
from toolrollout.engines._wire import encode_json, generate_body

# The server: counts the requests it has read, answers each after /release is posted.
SERVER = r"""
import asyncio, sys
from aiohttp import web
seen = 0
release = None
async def generate(request):
    global seen, release
    await request.read()
    seen += 1
    if release is None:
        release = asyncio.Event()
    await release.wait()
    return web.json_response({"text": "", "output_ids": [1], "meta_info": {
        "id": "x", "finish_reason": {"type": "length", "length": 1},
        "prompt_tokens": 1, "completion_tokens": 1, "cached_tokens": 0,
        "output_token_logprobs": [[-0.5, 1, None]], "weight_version": "default"}})
async def health(request):
    return web.json_response({"status": "ok"})
async def count(request):
    return web.json_response({"seen": seen})
async def let_go(request):
    global release, seen
    if release is not None:
        release.set()
    release, seen = None, 0
    return web.json_response({})
app = web.Application(client_max_size=2**30)
app.add_routes([web.post("/generate", generate), web.get("/seen", count),
                web.get("/health", health), web.post("/release", let_go)])
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""


def rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure(requests: int, tokens: int, seed: int = 0) -> dict[str, float]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port)])
    try:
        _wait_healthy(url, server, timeout=60)
        rng = random.Random(seed)
        batch = [
            GenerateRequest(
                input_ids=array("i", [rng.randrange(1_000, 150_000) for _ in range(tokens)]),
                sampling=SamplingParams(max_new_tokens=1),
                rid=f"r{i}",
            )
            for i in range(requests)
        ]
        body_bytes = len(encode_json(generate_body(batch[0], "r0")))
        held = 0

        async def wave() -> None:
            nonlocal held
            async with SGLangClient(url) as client, httpx.AsyncClient() as control:
                gc.collect()
                before = rss_bytes()
                async with anyio.create_task_group() as tg:
                    for request in batch:
                        tg.start_soon(client.generate, request)
                    # polled: the count lives in the server's process
                    while (await control.get(f"{url}/seen")).json()["seen"] < requests:  # noqa: ASYNC110
                        await anyio.sleep(0.05)
                    await anyio.sleep(0.5)
                    held = rss_bytes() - before
                    await control.post(f"{url}/release")

        anyio.run(wave)
    finally:
        stop_popen(server)
    per_token = held / (requests * tokens)
    body_per_token = body_bytes / tokens
    return {
        "requests": requests,
        "prompt_tokens": tokens,
        "held_bytes_per_request": held / requests,
        "held_bytes_per_prompt_token": per_token,
        "json_body_bytes_per_prompt_token": body_per_token,
        "held_over_json_body": per_token / body_per_token,
    }


def split(runs: list[dict[str, float]]) -> dict[str, float]:
    """Least squares of the bytes held per request over the prompt length: the slope is
    what each prompt token costs a waiting request, the intercept what a request costs
    whatever its length."""
    fit = statistics.linear_regression(
        [run["prompt_tokens"] for run in runs], [run["held_bytes_per_request"] for run in runs]
    )
    return {
        "bytes_per_prompt_token_at_the_margin": fit.slope,
        "bytes_per_request": fit.intercept,
        "json_body_bytes_per_prompt_token": runs[-1]["json_body_bytes_per_prompt_token"],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument(
        "--tokens", default="2000", help="prompt tokens per request; several: 500,2000,8000"
    )
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    lengths = [int(n) for n in args.tokens.split(",")]
    if len(lengths) == 1:
        report: dict[str, Any] = dict(measure(args.requests, lengths[0]))
    else:  # each length in a fresh process, then the split
        runs = [
            json.loads(
                subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--requests",
                        str(args.requests),
                        "--tokens",
                        str(n),
                    ],
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
            )
            for n in lengths
        ]
        report = {"runs": runs, "split": split(runs)}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
