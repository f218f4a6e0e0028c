"""Engine faults injected for real: a killed and restarted server, 5xx bursts, hung
responses, connection resets, truncated bodies, and an engine that never comes back.

The model server is the real ``toolrollout serve`` with the demo model; network faults go
through :class:`tests.faults._proxy.FaultProxy`, a real TCP proxy that sends real 503s,
RSTs and cut bodies (the documented seam for faults a healthy server does not make).
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import pytest
from tests._processes import free_port, stop, wait_http
from tests.faults._proxy import FaultProxy

from toolrollout.apps.demo import load_demo_prompts
from toolrollout.engines import RetryPolicy, SamplingParams, SGLangClient
from toolrollout.rollout import RolloutConfig, RolloutRunner, Trajectory
from toolrollout.tools import calculator_tool

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
CONFIG = RolloutConfig(
    sampling=SamplingParams(max_new_tokens=64, temperature=1.0), n=2, max_turns=3, seed=7
)


def start_server(port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "toolrollout",
            "serve",
            "--port",
            str(port),
            "--threads",
            "1",
            "--max-batch-size",
            "4",
            "--log-level",
            "warning",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=ENV,
    )


@dataclass
class Server:
    """The module's server; the restart test replaces its process (one start saved)."""

    port: int
    procs: list[subprocess.Popen[bytes]]


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    port = free_port()
    live = Server(port, [start_server(port)])
    try:
        wait_http(f"http://127.0.0.1:{port}/health", 400, live.procs[0])
        yield live
    finally:
        for proc in live.procs:
            stop(proc)


def check_rows(results: list[Trajectory], prompts: int) -> None:
    """Every sample once, none failed, token bookkeeping intact."""
    keys = [(t.prompt_index, t.sample_index) for t in results]
    assert keys == [(p, s) for p in range(prompts) for s in range(CONFIG.n)]
    assert [t.error for t in results if t.failed] == []
    for t in results:
        assert len(t.response_ids) == len(t.loss_mask) == len(t.rollout_logprobs)
        assert sum(1 for s in t.spans if s.kind == "model") == t.num_turns >= 1


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_5xx_bursts_resets_truncated_bodies_and_hangs_are_retried(
    server: Server, demo_tokenizer: Any
) -> None:
    # A burst of six 503s, then a cycle that faults two requests in three.
    cycle = itertools.cycle(["pass", "reset", "truncate", "pass", "hang", "503"])
    plan = lambda k: "503" if k < 6 else next(cycle)  # noqa: E731
    prompts = load_demo_prompts()[:6]

    async def main(proxy: FaultProxy) -> tuple[list[Trajectory], int]:
        client = SGLangClient(
            proxy.url,
            timeout=httpx.Timeout(5.0, connect=2.0),
            retry=RetryPolicy(
                max_attempts=12,
                initial_backoff=0.05,
                max_backoff=0.3,
                jitter=0.05,
                retry_timeouts=True,
            ),
        )
        async with client:
            await client.wait_healthy(timeout=30)
            runner = RolloutRunner(client, demo_tokenizer, [calculator_tool()], config=CONFIG)
            return await runner.run(prompts), client.stats().retries

    with FaultProxy(server.port, plan) as proxy:
        started = time.monotonic()
        results, retries = anyio.run(main, proxy)
        elapsed = time.monotonic() - started
    check_rows(results, len(prompts))
    injected = [f for f in proxy.faults if f != "pass"]
    assert set(injected) == {"503", "reset", "truncate", "hang"}
    assert retries >= len(injected)  # every injected fault was retried
    assert elapsed < 180


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_server_killed_and_restarted_mid_run(server: Server, demo_tokenizer: Any) -> None:
    url = f"http://127.0.0.1:{server.port}"
    procs = server.procs
    prompts = load_demo_prompts()[:10]
    restarted_at: list[int] = []

    def on_result(_: Trajectory) -> None:
        done = on_result.count = getattr(on_result, "count", 0) + 1  # type: ignore[attr-defined]
        if done == 4:  # mid-run: kill -9 with requests in flight, start a fresh server
            procs[-1].kill()
            procs[-1].wait()
            restarted_at.append(done)
            procs.append(start_server(server.port))

    async def main() -> tuple[list[Trajectory], int]:
        # Patient enough to outlast a restart on a busy machine (up to ~6 minutes).
        retry = RetryPolicy(max_attempts=400, initial_backoff=0.2, max_backoff=1.0, jitter=0.1)
        async with SGLangClient(url, retry=retry) as client:
            await client.wait_healthy(timeout=400)
            runner = RolloutRunner(client, demo_tokenizer, [calculator_tool()], config=CONFIG)
            return await runner.run(prompts, on_result=on_result), client.stats().retries

    results, retries = anyio.run(main)
    assert restarted_at == [4]
    check_rows(results, len(prompts))
    assert retries > 0  # the requests in flight at the kill were retried on the new server


def dead_engine_run(url: str, demo_tokenizer: Any, read_timeout: float) -> list[Trajectory]:
    async def main() -> list[Trajectory]:
        retry = RetryPolicy(
            max_attempts=3, initial_backoff=0.1, max_backoff=0.2, retry_timeouts=True
        )
        timeout = httpx.Timeout(read_timeout, connect=1.0)
        async with SGLangClient(url, retry=retry, timeout=timeout) as client:
            runner = RolloutRunner(client, demo_tokenizer, [calculator_tool()], config=CONFIG)
            return await runner.run(load_demo_prompts()[:5])

    return anyio.run(main)


def test_dead_engine_fails_every_trajectory_in_bounded_time(demo_tokenizer: Any) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: connection refused
    started = time.monotonic()
    results = dead_engine_run(url, demo_tokenizer, read_timeout=1.0)
    assert time.monotonic() - started < 10
    assert len(results) == 10 and all(t.failed and t.reward is None for t in results)
    for t in results:
        assert t.finish_reason == "error" and t.error is not None
        assert t.error.startswith("EngineUnavailable") and "gave up after 3 attempts" in t.error
        assert "could not connect" in t.error


def test_hung_engine_fails_every_trajectory_in_bounded_time(demo_tokenizer: Any) -> None:
    with FaultProxy(None, lambda k: "hang") as proxy:
        started = time.monotonic()
        results = dead_engine_run(proxy.url, demo_tokenizer, read_timeout=0.5)
        elapsed = time.monotonic() - started
    assert elapsed < 10  # 3 attempts of 0.5 s plus backoff, all samples at once
    assert len(proxy.faults) == 3 * 10
    assert len(results) == 10 and all(t.failed for t in results)
    assert all(t.error is not None and "no answer" in t.error for t in results)
