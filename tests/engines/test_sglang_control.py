"""SGLangClient's control plane over several servers: merged info, every error kept.

The servers are ``httpx.MockTransport`` handlers answering with SGLang's field names
(``/model_info``'s ``has_image_understanding``; ``/server_info``'s ``context_length`` and
``max_req_input_len``, see tests/engines/fixtures/README.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from toolrollout._exceptions import EngineError, EngineRequestRejected
from toolrollout.engines import EngineServersFailed, RetryPolicy, SGLangClient

FIXTURES = Path(__file__).parent / "fixtures"
S0, S1, S2 = "http://s0:30000", "http://s1:30000", "http://s2:30000"
NO_WAIT = RetryPolicy(max_attempts=2, initial_backoff=0.0, max_backoff=0.0, jitter=0.0)
MODEL_INFO = json.loads((FIXTURES / "sglang_model_info.json").read_text())
LEGACY_MODEL_INFO = json.loads((FIXTURES / "sglang_get_model_info_legacy.json").read_text())


def host(request: httpx.Request) -> str:
    return f"http://{request.url.host}:{request.url.port}"


def client(handler: Any, urls: tuple[str, ...]) -> SGLangClient:
    return SGLangClient(urls, transport=httpx.MockTransport(handler), retry=NO_WAIT)


async def test_info_merges_servers_and_reads_sglang_fields() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        server, path = host(request), request.url.path
        if server == S0 and path == "/model_info":
            return httpx.Response(200, json={**MODEL_INFO, "has_image_understanding": True})
        if server == S0 and path == "/server_info":
            return httpx.Response(200, json={"context_length": 32768, "max_req_input_len": 9})
        if server == S1 and path == "/get_model_info":  # an older server
            return httpx.Response(200, json={**LEGACY_MODEL_INFO, "weight_version": "step-2"})
        if server == S1 and path == "/get_server_info":
            # launched without --context-length: SGLang reports null and its input bound
            return httpx.Response(200, json={"context_length": None, "max_req_input_len": 4095})
        return httpx.Response(404, json={"detail": "Not Found"})

    async with client(handler, (S0, S1)) as engine:
        info = await engine.info()
    first, second = info.servers
    assert (first.url, first.context_length, first.vision) == (S0, 32768, True)
    assert first.weight_version == "default" and first.model_path == MODEL_INFO["model_path"]
    assert (second.url, second.context_length, second.vision) == (S1, 4096, False)
    assert second.weight_version == "step-2"
    assert info.context_length == 4096  # the strictest server
    assert info.vision is False  # not every server takes images
    assert info.weight_version is None  # the servers disagree
    assert info.model_path == MODEL_INFO["model_path"]


async def test_a_failure_on_one_server_is_raised_as_it_is() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        if host(request) == S1:
            return httpx.Response(400, json={"error": {"message": "bad mode"}})
        return httpx.Response(200, json={"status": "ok"})

    async with client(handler, (S0, S1)) as engine:
        with pytest.raises(EngineRequestRejected, match="bad mode"):
            await engine.pause_generation()


async def test_failures_on_several_servers_are_all_kept() -> None:
    seen: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append(host(request))
        if host(request) == S0:
            body = {"success": True, "message": "ok", "num_paused_requests": 0}
            return httpx.Response(200, json=body)
        if host(request) == S1:
            body = {"success": False, "message": "no such folder", "num_paused_requests": 0}
            return httpx.Response(400, json=body)
        return httpx.Response(503, json={"error": {"message": "restarting"}})

    async with client(handler, (S0, S1, S2)) as engine:
        with pytest.raises(EngineServersFailed) as caught:
            await engine.update_weights_from_disk("/ckpt/step-3", weight_version="step-3")
    failed = caught.value
    assert isinstance(failed, EngineError)  # `except EngineError` still catches it
    assert list(failed.errors) == [S1, S2]
    assert isinstance(failed.errors[S1], EngineRequestRejected)
    assert "no such folder" in str(failed) and "restarting" in str(failed)
    assert S1 in str(failed) and S2 in str(failed)
    assert sorted(set(seen)) == [S0, S1, S2]  # every server was tried
    refusals = failed.split(EngineRequestRejected)[0]
    assert refusals is not None and len(refusals.exceptions) == 1


async def test_update_answers_by_server_in_url_order() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        paused = 2 if host(request) == S1 else 0
        body = {"success": True, "message": f"done {host(request)}", "num_paused_requests": paused}
        return httpx.Response(200, json=body)

    async with client(handler, (S0, S1)) as engine:
        update = await engine.update_weights_from_disk(Path("/ckpt/step-4"))
    assert [s.url for s in update.servers] == [S0, S1]
    assert update.servers[1].message == f"done {S1}"
    assert update.num_paused_requests == 2
    assert update.model_path == "/ckpt/step-4" and update.weight_version is None


async def test_a_seeded_request_logs_once_which_servers_ignore_the_seed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """SGLang reads ``sampling_seed`` only under ``--enable-deterministic-inference``
    (tests/real_engines/sglang/test_generate.py shows the real server ignoring it)."""
    from toolrollout.engines import GenerateRequest, SamplingParams

    asked: list[str] = []
    body = json.loads((FIXTURES / "sglang_generate_stop_eos.json").read_text())

    async def handler(request: httpx.Request) -> httpx.Response:
        server, path = host(request), request.url.path
        if path == "/server_info":
            asked.append(server)
            return httpx.Response(200, json={"enable_deterministic_inference": server == S1})
        return httpx.Response(200, json=body)

    seeded = GenerateRequest(input_ids=[1, 2], sampling=SamplingParams(seed=3))
    async with client(handler, (S0, S1)) as engine:
        await engine.generate(GenerateRequest(input_ids=[1, 2]))
        assert asked == []  # no seed, no question
        with caplog.at_level("WARNING", logger="toolrollout.engines.sglang"):
            await engine.generate(seeded)
            await engine.generate(seeded)
    assert sorted(asked) == [S0, S1]  # asked once per server, not per request
    (record,) = [r for r in caplog.records if "sampling_seed" in r.getMessage()]
    assert record.getMessage().startswith(f"{S0} ignores sampling_seed")
    assert S1 not in record.getMessage()


def test_the_served_dtype_resolves_sglangs_auto(tmp_path: Path) -> None:
    from toolrollout.engines.sglang._control import served_dtype

    def folder(name: str, config: dict[str, Any]) -> str:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
        return str(tmp_path / name)

    fp32 = folder("fp32", {"model_type": "qwen2", "torch_dtype": "float32"})
    gemma = folder("gemma", {"model_type": "gemma3", "torch_dtype": "float32"})
    bf16 = folder("bf16", {"model_type": "qwen2", "torch_dtype": "bfloat16"})
    assert served_dtype({"dtype": "auto", "model_path": fp32}) == "float16"
    assert served_dtype({"dtype": "auto", "model_path": gemma}) == "bfloat16"
    assert served_dtype({"dtype": "auto", "model_path": bf16}) == "bfloat16"
    assert served_dtype({"dtype": "float32", "model_path": fp32}) == "float32"
    assert served_dtype({"dtype": "auto", "model_path": str(tmp_path / "elsewhere")}) == "auto"
    assert served_dtype({}) is None
