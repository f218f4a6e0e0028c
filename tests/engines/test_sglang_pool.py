"""The client's connection pool against a real HTTP server holding 1,500 requests at once.

A request past the pool's size waits inside the client, where neither the server nor a
scheduling policy sees it. These tests hold more requests in flight than the default pool
(1,024 connections) and read the server's own log of when each request arrived and ended.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from tests._processes import free_port, wait_http

from toolrollout._net import open_file_limit
from toolrollout.apps.bench._metrics import peak_in_flight
from toolrollout.apps.demo import DEMO_MODEL_PATH
from toolrollout.engines import (
    GenerateRequest,
    SamplingParams,
    SGLangClient,
    connection_limits,
)
from toolrollout.engines.sglang import DEFAULT_LIMITS
from toolrollout.rollout import RolloutConfig
from toolrollout.spec import RunSpec

IN_FLIGHT = 1_500
FILES_NEEDED = 4 * IN_FLIGHT  # the client's sockets, the server's, and room for the rest


@pytest.fixture(scope="module")
def latency_server() -> Iterator[str]:
    """The benchmark's latency-model server: each request holds a slot for about 3 s
    (20 tokens; at 1 s a loaded machine sent the last requests after the first had ended)."""
    if open_file_limit(FILES_NEEDED) < FILES_NEEDED:  # the child inherits the raised limit
        pytest.skip(f"the hard open-file limit is below {FILES_NEEDED}")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = [
        sys.executable, "-m", "toolrollout.apps.bench.serve_model", f"--port={port}",
        f"--tokenizer={DEMO_MODEL_PATH}", f"--capacity={2 * IN_FLIGHT}",
        "--prefill-per-token=0", "--decode-per-token=0.15",
    ]  # fmt: skip
    proc = subprocess.Popen(args)
    try:
        wait_http(f"{url}/health", 120, proc)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


async def hold_many(url: str, **client: Any) -> tuple[int, Any]:
    """Send IN_FLIGHT requests at once; return the server's peak and the client's stats."""
    async with httpx.AsyncClient() as http:
        await http.post(f"{url}/bench/reset")
    request = GenerateRequest(
        input_ids=tuple(range(100, 120)), sampling=SamplingParams(max_new_tokens=20)
    )
    async with SGLangClient(url, **client) as engine:
        results = await asyncio.gather(*(engine.generate(request) for _ in range(IN_FLIGHT)))
        stats = engine.stats()
    assert len(results) == IN_FLIGHT and all(r.completion_tokens > 0 for r in results)
    async with httpx.AsyncClient() as http:
        log = (await http.get(f"{url}/bench/log")).json()["requests"]
    assert len(log) == IN_FLIGHT
    return peak_in_flight(log), stats


async def test_a_pool_sized_to_the_run_puts_every_request_on_the_wire(
    latency_server: str,
) -> None:
    peak, stats = await hold_many(latency_server, limits=connection_limits(IN_FLIGHT))
    assert stats.max_connections == IN_FLIGHT + 64
    assert stats.pool_waits == 0
    assert peak > (DEFAULT_LIMITS.max_connections or 0), f"the server held at most {peak}"
    assert peak >= 0.9 * IN_FLIGHT, f"the server held at most {peak} of {IN_FLIGHT}"


async def test_the_default_pool_caps_the_wire_and_says_so(
    latency_server: str, caplog: pytest.LogCaptureFixture
) -> None:
    cap = DEFAULT_LIMITS.max_connections or 0
    with caplog.at_level(logging.WARNING, logger="toolrollout.engines.sglang"):
        peak, stats = await hold_many(latency_server)
    assert peak <= cap, f"the server held {peak} through a pool of {cap}"
    assert stats.max_connections == cap
    assert stats.pool_waits == IN_FLIGHT - cap
    warnings = [r.getMessage() for r in caplog.records if "connection pool" in r.getMessage()]
    assert len(warnings) == 1 and f"more than {cap} requests" in warnings[0]


def test_the_run_spec_sizes_the_pool_to_its_concurrency() -> None:
    small = RunSpec(config=RolloutConfig(concurrency=8)).client_options()["limits"]
    big = RunSpec(config=RolloutConfig(concurrency=5_000)).client_options()["limits"]
    assert small.max_connections == DEFAULT_LIMITS.max_connections  # never below the default
    assert big.max_connections == 5_000 + 64


OPEN_FILES = """
import logging, resource, sys
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, {hard}))
from toolrollout.engines import SGLangClient, connection_limits
client = SGLangClient("http://127.0.0.1:9", limits=connection_limits({concurrency}))
print("soft", resource.getrlimit(resource.RLIMIT_NOFILE)[0])
print("pool", client.stats().max_connections)
"""


def open_files_run(soft: int, hard: int, concurrency: int) -> tuple[dict[str, int], str]:
    code = OPEN_FILES.format(soft=soft, hard=hard, concurrency=concurrency)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    values = {
        line.split()[0]: int(line.split()[1])
        for line in done.stdout.splitlines()
        if line.split()[0] in ("soft", "pool")
    }
    return values, done.stdout


def test_the_client_raises_the_soft_open_file_limit_for_its_pool() -> None:
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 2_320:
        pytest.skip(f"the hard open-file limit ({hard}) is below the 2,320 this pool needs")
    # an unprivileged process may lower its hard limit but not raise it
    cap = 8192 if hard == resource.RLIM_INFINITY else min(8192, hard)
    values, out = open_files_run(1024, cap, 2_000)
    assert values == {"soft": 2_064 + 256, "pool": 2_064}, out
    assert "raised the open-file limit from 1024 to 2320" in out


def test_a_hard_open_file_limit_caps_the_pool_with_a_warning() -> None:
    values, out = open_files_run(512, 1024, 2_000)
    assert values == {"soft": 1024, "pool": 1024 - 256}, out
    assert "a pool of 2064 connections needs 2320 open files, but the limit is 1024" in out
