"""`toolrollout serve` behind PyPI's real sglang-router.

Two workers and the router run as separate processes on loopback; everything goes through
the router's `/generate`, driven both with raw httpx and with toolrollout's SGLangClient.
This is the evidence that the embedded server fits the SGLang ecosystem.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from tests._processes import free_port, stop, wait_http
from tests._waiting import wait_until

from toolrollout.engines import GenerateRequest, SamplingParams, SGLangClient

pytestmark = pytest.mark.router


@pytest.fixture(scope="module")
def cluster(
    tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    if shutil.which("sglang-router") is None and not _has_module("sglang_router"):
        pytest.fail("sglang-router is a test dependency: pip install -e '.[test]'")
    logs = tmp_path_factory.mktemp("router-logs")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    workers: list[str] = []
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i in range(2):
            port = free_port()
            log = (logs / f"worker{i}.log").open("wb")
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "toolrollout",
                    "serve",
                    "--model",
                    str(tiny_model_path),
                    "--port",
                    str(port),
                    "--threads",
                    "1",
                    "--log-level",
                    "warning",
                    # room for a long generation to abort (the random model has no real limit)
                    "--context-length",
                    "8192",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
            procs.append(proc)
            workers.append(f"http://127.0.0.1:{port}")
        for url, proc in zip(workers, procs, strict=True):
            wait_http(f"{url}/health", 120, proc)
        router_port = free_port()
        log = (logs / "router.log").open("wb")
        router = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sglang_router.launch_router",
                "--host",
                "127.0.0.1",
                "--port",
                str(router_port),
                "--worker-urls",
                *workers,
                "--policy",
                "round_robin",
                "--log-level",
                "warn",
                # the metrics listener defaults to 0.0.0.0:29000; a free loopback port keeps
                # another router on the machine from failing this one's start-up
                "--prometheus-host",
                "127.0.0.1",
                "--prometheus-port",
                str(free_port()),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        procs.append(router)
        router_url = f"http://127.0.0.1:{router_port}"
        wait_http(f"{router_url}/health", 60, router)
        # The router only forwards once it has registered the workers.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            r = httpx.post(
                f"{router_url}/generate",
                json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1}},
                timeout=30,
            )
            if r.status_code == 200:
                break
            time.sleep(0.5)
        yield {"router": router_url, "workers": workers, "logs": logs}
    finally:
        for proc in reversed(procs):
            stop(proc)


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def test_single_generate_with_logprobs_through_router(cluster: dict[str, Any]) -> None:
    body = {
        "input_ids": [5, 6, 7, 8],
        "sampling_params": {"max_new_tokens": 6, "temperature": 0.0, "ignore_eos": True},
        "return_logprob": True,
        "rid": "router-single",
    }
    r = httpx.post(f"{cluster['router']}/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    meta = out["meta_info"]
    assert len(out["output_ids"]) == 6 == meta["completion_tokens"]
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert [e[1] for e in meta["output_token_logprobs"]] == out["output_ids"]
    assert all(e[0] <= 0.0 for e in meta["output_token_logprobs"])
    assert meta["prompt_tokens"] == 4
    # The same greedy request straight to a worker gives the same tokens.
    direct = httpx.post(f"{cluster['workers'][0]}/generate", json=body | {"rid": "d"}, timeout=60)
    assert direct.json()["output_ids"] == out["output_ids"]


def test_batch_through_router_keeps_input_order(cluster: dict[str, Any]) -> None:
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13], [20]]
    body = {
        "input_ids": prompts,
        "sampling_params": {"max_new_tokens": 3, "temperature": 0.0, "ignore_eos": True},
    }
    r = httpx.post(f"{cluster['router']}/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    assert isinstance(out, list) and len(out) == 3
    assert [o["meta_info"]["prompt_tokens"] for o in out] == [3, 5, 1]


def test_streaming_through_router(cluster: dict[str, Any]) -> None:
    """Cumulative SSE chunks pass through the router, one stream per sub-request of a batch.

    The server sends only the newest of the chunks that piled up while it was busy
    (cumulative chunks make the older ones redundant), so how many chunks one request gets
    depends on timing. A batch of two gets at least one final chunk for each, so the
    router must pass on at least two events.
    """
    body = {
        "input_ids": [[5, 6, 7], [8, 9]],
        "sampling_params": {"max_new_tokens": 5, "temperature": 0.0, "ignore_eos": True},
        "stream": True,
        "return_logprob": True,
    }
    chunks: list[str] = []
    with httpx.stream("POST", f"{cluster['router']}/generate", json=body, timeout=60) as r:
        assert r.status_code == 200
        chunks.extend(line[len("data: ") :] for line in r.iter_lines() if line.startswith("data: "))
    assert chunks[-1] == "[DONE]"
    payloads = [json.loads(c) for c in chunks[:-1]]
    assert {p["index"] for p in payloads} == {0, 1}
    for index in (0, 1):
        own = [p for p in payloads if p["index"] == index]
        lengths = [len(p["output_ids"]) for p in own]
        assert lengths == sorted(lengths) and lengths[-1] == 5  # cumulative chunks
        assert own[-1]["meta_info"]["finish_reason"]["type"] == "length"
        assert all(p["meta_info"]["finish_reason"] is None for p in own[:-1])


async def test_client_and_abort_through_router(cluster: dict[str, Any]) -> None:
    """SGLangClient drives the router; abort goes to the workers (the router has no
    /abort_request) and the router hands back the partial output."""
    async with SGLangClient(cluster["router"], abort_urls=cluster["workers"]) as client:
        await client.wait_healthy(timeout=30)
        result = await client.generate(
            GenerateRequest(
                input_ids=(5, 6, 7),
                sampling=SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True),
            )
        )
        assert len(result.output_ids) == 4 and len(result.output_logprobs or ()) == 4
        assert result.finish_reason.type == "length"

        long = GenerateRequest(
            input_ids=(5, 6, 7),
            sampling=SamplingParams(max_new_tokens=8000, ignore_eos=True),
            rid="router-abort-me",
        )
        outcome: dict[str, Any] = {}

        async def run() -> None:
            outcome["result"] = await client.generate(long)

        async def generating() -> bool:
            """Whether a worker's running batch holds output tokens (KV beyond the prompt)."""
            async with httpx.AsyncClient() as http:
                loads = [(await http.get(f"{w}/get_load")).json()[0] for w in cluster["workers"]]
            return sum(int(load["num_tokens"]) for load in loads) > len(long.input_ids)

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await wait_until(generating, what="the long request generating")
            await client.abort("router-abort-me")
        aborted = outcome["result"]
        assert aborted.finish_reason.type == "abort"
        assert 0 < len(aborted.output_ids) < 8000
        assert len(aborted.output_logprobs or ()) == len(aborted.output_ids)


def test_router_reports_workers_healthy_and_bad_request_is_4xx(cluster: dict[str, Any]) -> None:
    r = httpx.post(
        f"{cluster['router']}/generate",
        json={"input_ids": [1, 2], "sampling_params": {"temperature": -1}},
        timeout=30,
    )
    assert 400 <= r.status_code < 500
    ok = httpx.post(
        f"{cluster['router']}/generate",
        json={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}},
        timeout=30,
    )
    assert ok.status_code == 200
