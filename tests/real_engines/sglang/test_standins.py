"""The project's SGLang stand-ins against the real server: what the client reads must agree.

Two servers written here speak SGLang's API: ``toolrollout serve`` (the embedded engine
over HTTP, which users run where SGLang does not) and the benchmark's latency model
(``toolrollout.apps.bench.serve_model``, a GPU-sized server simulated on a CPU). Each
field the SGLang client reads (``engines/sglang/_control.py``, ``engines/_wire.py``,
``engines/_scheduling.py``) is asked of the real server and of both stand-ins, and must
have the same JSON type and meaning; where a stand-in differs on purpose, the test says
why. ``toolrollout serve`` runs the same demo checkpoint in float32, so its greedy ids and
their logprobs must also be the real server's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests._processes import free_port, stop, wait_http
from tests.real_engines.sglang._launch import DEMO_MODEL, LIMIT, SGLangServer
from tests.real_engines.sglang._prompts import chat_ids
from tests.real_engines.sglang.test_priority import BLOCKER, finishing_order, request
from toolrollout.engines import GenerateRequest, SamplingParams, SGLangClient

pytestmark = [pytest.mark.real_engine, pytest.mark.slow, pytest.mark.timeout(LIMIT)]

SERVER_INFO = (
    "model_path", "version", "dtype", "weight_version", "context_length",
    "max_req_input_len", "enable_priority_scheduling", "schedule_low_priority_values_first",
    "priority_scheduling_preemption_threshold", "enable_deterministic_inference",
)  # fmt: skip
"""``/server_info`` fields the client reads (info, dtype check, seed check, priority)."""
MODEL_INFO = ("model_path", "weight_version", "has_image_understanding")
LOAD = ("num_running_reqs", "num_waiting_reqs", "token_usage", "max_total_num_tokens")
"""``/v1/loads`` fields admission control reads (and ``queues.retracted``)."""
META = (
    "id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens",
    "weight_version", "weight_versions", "output_token_logprobs", "e2e_latency",
)  # fmt: skip
"""``/generate`` ``meta_info`` fields the wire parser reads."""

FIXTURES = Path(__file__).parents[2] / "engines" / "fixtures"

LATENCY_MODEL_LACKS = {"version", "dtype", "context_length", "max_req_input_len"}
"""It serves no checkpoint and has no context limit: the client then records no engine
version or dtype, skips the dtype check, and takes the context length from the run."""


def _start(argv: list[str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", *argv, "--port", str(port)],
            stdout=out, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/health", 180, proc)
    except BaseException:
        stop(proc)
        raise
    return proc, url


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``toolrollout serve`` on the demo model, float32, the real server's context length."""
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    proc, url = _start(
        ["toolrollout", "serve", "--threads", "1", "--dtype", "float32",
         "--context-length", "1024"],
        log,
    )  # fmt: skip
    yield url
    stop(proc)


@pytest.fixture(scope="module")
def latency_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("latency") / "latency.log"
    proc, url = _start(
        ["toolrollout.apps.bench.serve_model", "--enable-priority-scheduling", "--capacity", "1",
         "--max-total-tokens", "8192", "--decode-per-token", "0.01"],
        log,
    )  # fmt: skip
    yield url
    stop(proc)


def snapshot(url: str) -> dict[str, Any]:
    """What the client reads from one server, route by route."""
    body = {
        "input_ids": chat_ids("What is 6 * 7?"),
        "sampling_params": {"max_new_tokens": 24, "temperature": 0.0, "no_stop_trim": True},
        "return_logprob": True,
        "logprob_start_len": -1,
    }
    with httpx.Client(base_url=url, timeout=120) as http:
        return {
            "server_info": http.get("/server_info").json(),
            "model_info": http.get("/model_info").json(),
            "load": http.get("/v1/loads", params={"include": "core,queues"}).json()["loads"][0],
            "generate": http.post("/generate", json=body).json(),
        }


def kinds(data: dict[str, Any], keys: tuple[str, ...]) -> dict[str, str]:
    """Each key's JSON type (missing: ``absent``; an int is a number, as JSON has it)."""

    def kind(value: Any) -> str:
        if isinstance(value, bool):
            return "bool"
        return "number" if isinstance(value, int | float) else type(value).__name__

    return {k: kind(data[k]) if k in data else "absent" for k in keys}


@pytest.fixture(scope="module")
def real(sglang_fp32: SGLangServer) -> dict[str, Any]:
    return snapshot(sglang_fp32.url)


def test_serve_answers_every_field_as_the_real_server(real: dict[str, Any], serve: str) -> None:
    ours = snapshot(serve)
    for route, keys in (("server_info", SERVER_INFO), ("model_info", MODEL_INFO), ("load", LOAD)):
        assert kinds(ours[route], keys) == kinds(real[route], keys), route
    assert kinds(ours["generate"]["meta_info"], META) == kinds(real["generate"]["meta_info"], META)
    assert "retracted" in ours["load"]["queues"] and "retracted" in real["load"]["queues"]
    for key in ("model_path", "dtype", "context_length"):
        assert ours["server_info"][key] == real["server_info"][key], key
    # SGLang keeps 5 tokens of the context from inputs (tp_worker.py: min(context - 1,
    # KV pool - 1) - 5); serve takes inputs up to context - 1 and says so.
    assert real["server_info"]["max_req_input_len"] == 1024 - 6
    assert ours["server_info"]["max_req_input_len"] == 1024 - 1
    # serve honours sampling_seed and says so, as SGLang does only when started with
    # --enable-deterministic-inference (this one was not: the client warns there).
    assert ours["server_info"]["enable_deterministic_inference"] is True
    assert real["server_info"]["enable_deterministic_inference"] is False
    # The same checkpoint in float32: the same greedy ids, the same logprobs.
    mine, theirs = ours["generate"], real["generate"]
    assert mine["output_ids"] == theirs["output_ids"]
    assert mine["meta_info"]["finish_reason"] == theirs["meta_info"]["finish_reason"]
    assert mine["meta_info"]["weight_versions"] == theirs["meta_info"]["weight_versions"]
    pairs = zip(
        mine["meta_info"]["output_token_logprobs"],
        theirs["meta_info"]["output_token_logprobs"],
        strict=True,
    )
    assert max(abs(a[0] - b[0]) for a, b in pairs) < 1e-4


def test_the_latency_model_answers_what_the_client_reads(
    real: dict[str, Any], latency_model: str
) -> None:
    ours = snapshot(latency_model)
    shared = tuple(k for k in SERVER_INFO if k not in LATENCY_MODEL_LACKS)
    assert kinds(ours["server_info"], shared) == kinds(real["server_info"], shared)
    assert kinds(ours["server_info"], tuple(LATENCY_MODEL_LACKS)) == dict.fromkeys(
        LATENCY_MODEL_LACKS, "absent"
    )
    assert kinds(ours["model_info"], MODEL_INFO) == kinds(real["model_info"], MODEL_INFO)
    assert kinds(ours["load"], LOAD) == kinds(real["load"], LOAD)
    assert "retracted" in ours["load"]["queues"]
    meta, real_meta = ours["generate"]["meta_info"], real["generate"]["meta_info"]
    assert kinds(meta, META) == kinds(real_meta, META)
    spans = meta["weight_versions"]
    assert spans == [{"version": "default", "start": 0, "end": meta["completion_tokens"]}]


async def test_the_client_reads_the_same_facts_from_each(
    sglang_fp32: SGLangServer, serve: str, latency_model: str
) -> None:
    """``info()`` as an output file records it, and the spans the wire parser keeps."""
    infos = {}
    for name, url in (("real", sglang_fp32.url), ("serve", serve), ("latency", latency_model)):
        async with SGLangClient(url) as client:
            (infos[name],) = (await client.info()).servers
            result = await client.generate(
                GenerateRequest(
                    input_ids=chat_ids("What is 6 * 7?"),
                    sampling=SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True),
                )
            )
        assert result.weight_spans == ((0, 8, "default"),), name
    real, serve_info, latency = infos["real"], infos["serve"], infos["latency"]
    assert (real.engine, serve_info.engine, latency.engine) == (
        "sglang", "toolrollout-embedded", "toolrollout-latency-model"
    )  # fmt: skip
    assert real.dtype == serve_info.dtype == "float32" and latency.dtype is None
    assert real.context_length == serve_info.context_length == 1024
    assert real.model_path == serve_info.model_path == str(DEMO_MODEL)
    assert real.weight_version == serve_info.weight_version == latency.weight_version


async def test_the_latency_model_orders_its_queue_as_the_real_server(latency_model: str) -> None:
    """The same one-slot experiments as test_priority.py on the real server, with the
    same expected orders: the latency model's benchmark figures for the priority
    policies rest on it scheduling as SGLang does."""
    async with SGLangClient(latency_model) as client:
        queued = await finishing_order(
            client,
            request("blocker", 5, BLOCKER),
            [request("low", 0, 4), request("middle", 3, 4), request("high", 9, 4)],
        )
        preempted = await finishing_order(
            client, request("running", 0, BLOCKER), [request("urgent", 11, 4)], queue=False
        )
    assert queued == ["blocker", "high", "middle", "low"]
    assert preempted == ["urgent", "running"]


def test_the_wire_fixtures_have_the_real_servers_keys(real: dict[str, Any]) -> None:
    """tests/engines/fixtures/ were written from SGLang's source for the parser's unit
    tests; a finished answer must have the real server's keys, nothing more or less."""
    fixture = json.loads((FIXTURES / "sglang_generate_stop_eos.json").read_text())
    answer = real["generate"]
    assert set(fixture) == set(answer)
    # SGLang adds cached_tokens_details only when some prompt tokens came from the cache.
    conditional = set() if answer["meta_info"]["cached_tokens"] else {"cached_tokens_details"}
    assert set(fixture["meta_info"]) ^ set(answer["meta_info"]) <= conditional
