"""Wire tests: SGLang's own response shapes in, typed results out; our bodies, SGLang's fields.

Every response below is a fixture derived from SGLang's source (see fixtures/README.md),
served through ``httpx.MockTransport``, the client's documented test seam.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from toolrollout._exceptions import (
    EngineError,
    EngineHTTPError,
    EngineRequestRejected,
    EngineUnavailable,
    OverlongPromptError,
)
from toolrollout.engines._types import GenerateRequest, GenerateResult, SamplingParams
from toolrollout.engines.sglang import RetryPolicy, SGLangClient, StreamChunk

FIXTURES = Path(__file__).parent / "fixtures"
URL = "http://sglang-test:30000"
NO_WAIT = RetryPolicy(max_attempts=3, initial_backoff=0.0, max_backoff=0.0, jitter=0.0)


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text()


def fixture_json(name: str) -> Any:
    return json.loads(fixture_text(name))


GENERATE_REQ_INPUT_FIELDS = frozenset(
    fixture_json("sglang_generate_req_input_fields.json")["fields"]
)
SAMPLING_PARAMS_FIELDS = frozenset(fixture_json("sglang_sampling_params_fields.json")["fields"])


class Server:
    """A MockTransport handler that serves fixed answers and records what it received."""

    def __init__(self, routes: dict[str, tuple[int, bytes, str]]) -> None:
        self.routes = routes
        self.requests: list[httpx.Request] = []

    def bodies(self, path: str = "/generate") -> list[dict[str, Any]]:
        return [json.loads(r.content) for r in self.requests if r.url.path == path]

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        status, content, media = self.routes.get(
            request.url.path, (404, b'{"detail":"Not Found"}', "application/json")
        )
        return httpx.Response(status, content=content, headers={"content-type": media})


def json_route(name: str, status: int = 200) -> tuple[int, bytes, str]:
    return status, (FIXTURES / name).read_bytes(), "application/json"


def sse_route(name: str) -> tuple[int, bytes, str]:
    return 200, (FIXTURES / name).read_bytes(), "text/event-stream"


def client_for(server: Callable[[httpx.Request], httpx.Response]) -> SGLangClient:
    return SGLangClient(URL, transport=httpx.MockTransport(server), retry=NO_WAIT)


def ids_and_logprobs(name: str) -> tuple[tuple[int, ...], tuple[float, ...]]:
    entries = fixture_json(name)["meta_info"]["output_token_logprobs"]
    return tuple(e[1] for e in entries), tuple(e[0] for e in entries)


def assert_sglang_accepts(body: dict[str, Any]) -> None:
    """Every key we send is a GenerateReqInput field; every sampling key a SamplingParams one."""
    assert set(body) <= GENERATE_REQ_INPUT_FIELDS, set(body) - GENERATE_REQ_INPUT_FIELDS
    params = body["sampling_params"]
    for item in params if isinstance(params, list) else [params]:
        assert set(item) <= SAMPLING_PARAMS_FIELDS, set(item) - SAMPLING_PARAMS_FIELDS


# ----------------------------------------------------------------------- request bodies


def test_sampling_params_to_sglang_uses_only_sglang_keys() -> None:
    full = SamplingParams(
        max_new_tokens=64,
        temperature=0.7,
        top_p=0.9,
        top_k=20,
        min_p=0.05,
        stop=("</tool_call>",),
        stop_token_ids=(151645,),
        ignore_eos=True,
        seed=1234,
        n=4,
        skip_special_tokens=True,
    )
    body = full.to_sglang()
    assert set(body) <= SAMPLING_PARAMS_FIELDS
    # The two names the contract relies on exist in SGLang's SamplingParams.
    assert {"sampling_seed", "no_stop_trim"} <= SAMPLING_PARAMS_FIELDS
    assert body["sampling_seed"] == 1234
    assert body["no_stop_trim"] is True


async def test_generate_body_has_sglang_fields_and_values() -> None:
    server = Server({"/generate": json_route("sglang_generate_stop_eos.json")})
    request = GenerateRequest(
        input_ids=(151644, 8948, 198),
        sampling=SamplingParams(max_new_tokens=1024, seed=7, stop_token_ids=(151645,)),
        rid="ep42-t3",
        session_id="ep42",
        image_data=("data:image/png;base64,AAAA",),
    )
    async with client_for(server) as client:
        await client.generate(request)
    (body,) = server.bodies()
    assert_sglang_accepts(body)
    assert body["rid"] == "ep42-t3"
    assert body["input_ids"] == [151644, 8948, 198]
    assert body["return_logprob"] is True
    assert body["logprob_start_len"] == -1
    assert body["stream"] is False
    assert body["image_data"] == ["data:image/png;base64,AAAA"]
    assert "session_id" not in body  # routing is client-side; SGLang is not asked to pin
    assert body["sampling_params"] == {
        "max_new_tokens": 1024,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "min_p": 0.0,
        "skip_special_tokens": False,
        "no_stop_trim": True,
        "stop_token_ids": [151645],
        "sampling_seed": 7,
    }


async def test_stream_body_has_sglang_fields() -> None:
    server = Server({"/generate": sse_route("sglang_stream_cumulative.txt")})
    async with client_for(server) as client:
        async for _ in client.stream(GenerateRequest(input_ids=(1,) * 12, rid="s-1")):
            pass
    (stream,) = server.bodies()
    assert_sglang_accepts(stream)
    assert stream["stream"] is True


# ----------------------------------------------------------------------- responses


async def generate_with(fixture: str, request: GenerateRequest) -> GenerateResult:
    server = Server({"/generate": json_route(fixture)})
    async with client_for(server) as client:
        return await client.generate(request)


async def test_stop_on_eos_token() -> None:
    result = await generate_with(
        "sglang_generate_stop_eos.json", GenerateRequest(input_ids=(1,) * 812, rid="ep42-t3")
    )
    ids, logprobs = ids_and_logprobs("sglang_generate_stop_eos.json")
    assert result.rid == "ep42-t3"
    assert (
        result.output_ids
        == ids
        == tuple(fixture_json("sglang_generate_stop_eos.json")["output_ids"])
    )
    assert result.output_ids[-1] == 151645  # the EOS stays in the ids
    assert result.output_logprobs == logprobs
    assert result.finish_reason.type == "stop" and result.finish_reason.matched == 151645
    assert (result.prompt_tokens, result.completion_tokens, result.cached_tokens) == (812, 10, 768)
    assert result.weight_version == "default"
    assert result.e2e_latency == pytest.approx(0.4127)
    assert result.text is not None and result.text.endswith("<|im_end|>")
    assert result.server_url == URL


async def test_stop_on_string_with_extra_fields() -> None:
    result = await generate_with(
        "sglang_generate_stop_str.json", GenerateRequest(input_ids=(1,) * 640, rid="ep7-t0")
    )
    assert result.finish_reason.type == "stop"
    assert result.finish_reason.matched == "<tool_call>"
    assert result.weight_version == "step-12"
    assert result.cached_tokens == 512
    assert result.output_ids == (40, 1184, 311, 11047, 13, 151657)


async def test_length_without_logprobs() -> None:
    result = await generate_with(
        "sglang_generate_length_no_logprob.json",
        GenerateRequest(input_ids=(1,) * 30, rid="len-1", return_logprob=False),
    )
    assert result.output_ids == (785, 4226, 374, 220, 20)
    assert result.output_logprobs is None
    assert result.finish_reason.type == "length" and result.finish_reason.length == 5
    assert result.text == "The answer is 5"


async def test_skip_tokenizer_init_has_no_text() -> None:
    result = await generate_with(
        "sglang_generate_skip_tokenizer_init.json",
        GenerateRequest(input_ids=(1, 2, 3), rid="raw-1"),
    )
    assert result.text is None
    assert result.output_ids == (9707, 11, 1879, 151643)
    assert result.output_logprobs == (-0.5, -0.25, -0.125, -0.0625)


async def test_abort_while_running_returns_partial_output() -> None:
    result = await generate_with(
        "sglang_generate_abort_running.json", GenerateRequest(input_ids=(1,) * 845, rid="ep42-t4")
    )
    assert result.finish_reason.type == "abort"
    assert result.finish_reason.message == "Aborted"
    assert result.output_ids == (151657, 198, 4913)
    assert result.output_logprobs == (-0.0021, -0.0004, -0.0132)
    assert result.completion_tokens == 3


async def test_abort_in_waiting_queue_has_no_prompt_tokens() -> None:
    result = await generate_with(
        "sglang_generate_abort_waiting.json", GenerateRequest(input_ids=(1,) * 77, rid="ep42-t5")
    )
    assert result.finish_reason.type == "abort"
    assert result.finish_reason.message == "Abort in waiting queue"
    assert result.output_ids == ()
    assert result.output_logprobs == ()
    assert result.prompt_tokens == 77  # SGLang omits it here; the client knows what it sent
    assert result.completion_tokens == 0


# ----------------------------------------------------------------------- streaming


async def collect_stream(fixture: str, rid: str = "s-1") -> list[StreamChunk]:
    server = Server({"/generate": sse_route(fixture)})
    async with client_for(server) as client:
        return [c async for c in client.stream(GenerateRequest(input_ids=(1,) * 12, rid=rid))]


@pytest.mark.parametrize(
    "fixture", ["sglang_stream_cumulative.txt", "sglang_stream_incremental.txt"]
)
async def test_stream_chunks_are_cumulative_in_both_server_modes(fixture: str) -> None:
    chunks = await collect_stream(fixture)
    full = (151657, 198, 4913, 151658, 151645)
    assert [len(c.output_ids) for c in chunks] == [1, 3, 5]
    assert [c.new_ids for c in chunks] == [full[:1], full[1:3], full[3:]]
    assert [c.finished for c in chunks] == [False, False, True]
    assert chunks[1].text == '<tool_call>\n{"'
    final = chunks[-1].result
    assert final is not None
    assert final.output_ids == full
    assert final.output_logprobs == (-0.0021, -0.0004, -0.0132, -0.0012, -0.0003)
    assert final.finish_reason.matched == 151645
    assert final.text == '<tool_call>\n{"</tool_call><|im_end|>'
    assert final.completion_tokens == 5 and final.cached_tokens == 8
    assert final.e2e_latency == pytest.approx(0.21)


async def test_stream_error_event_raises_overlong() -> None:
    with pytest.raises(OverlongPromptError, match="longer than the model's context length") as info:
        await collect_stream("sglang_stream_error.txt")
    assert info.value.status_code == 400


async def test_stream_abort_with_status_raises() -> None:
    with pytest.raises(OverlongPromptError, match="exceeds the maximum allowed length"):
        await collect_stream("sglang_stream_abort_400.txt", rid="s-2")


async def test_stream_cut_before_final_chunk_is_a_connection_error() -> None:
    text = fixture_text("sglang_stream_cumulative.txt").split("\n\n")
    truncated = "\n\n".join(text[:2]) + "\n\n"  # two chunks, no final chunk, no [DONE]
    server = Server({"/generate": (200, truncated.encode(), "text/event-stream")})
    async with client_for(server) as client:
        with pytest.raises(EngineError, match="ended before its last chunk"):
            async for _ in client.stream(GenerateRequest(input_ids=(1,) * 12, rid="s-1")):
                pass


# ----------------------------------------------------------------------- error bodies


@pytest.mark.parametrize(
    ("fixture", "exc_type", "text"),
    [
        ("sglang_error_total_tokens_400.json", OverlongPromptError, "maximum context length"),
        ("sglang_error_input_longer_400.json", OverlongPromptError, "is longer than"),
        (
            "sglang_error_scheduler_input_length_400.json",
            OverlongPromptError,
            "--allow-auto-truncate",
        ),
        ("sglang_error_duplicate_rid_400.json", EngineRequestRejected, "Duplicate request ID"),
        ("sglang_error_validation_400.json", EngineRequestRejected, "Input should be a valid"),
    ],
)
async def test_400_bodies_map_to_rejections(
    fixture: str, exc_type: type[EngineRequestRejected], text: str
) -> None:
    server = Server({"/generate": json_route(fixture, status=400)})
    async with client_for(server) as client:
        with pytest.raises(exc_type, match=text) as info:
            await client.generate(GenerateRequest(input_ids=(1, 2)))
    assert type(info.value) is exc_type  # the duplicate-rid error is not "overlong"
    assert info.value.status_code == 400
    assert len(server.requests) == 1  # a 4xx is never retried


async def test_503_error_response_is_retried_then_unavailable() -> None:
    server = Server({"/generate": json_route("sglang_error_http_exception_503.json", status=503)})
    async with client_for(server) as client:
        with pytest.raises(EngineUnavailable) as info:
            await client.generate(GenerateRequest(input_ids=(1, 2)))
    cause = info.value.__cause__
    assert isinstance(cause, EngineHTTPError) and cause.status_code == 503
    assert "server is overloaded" in cause.message
    assert len(server.requests) == NO_WAIT.max_attempts


async def test_model_info_and_legacy_fallback() -> None:
    server = Server({"/model_info": json_route("sglang_model_info.json")})
    async with client_for(server) as client:
        info = await client.model_info()
    assert info["architectures"] == ["Qwen2ForCausalLM"] and info["weight_version"] == "default"

    legacy = Server({"/get_model_info": json_route("sglang_get_model_info_legacy.json")})
    async with client_for(legacy) as client:
        info = await client.model_info()
    assert info["is_generation"] is True
    assert [r.url.path for r in legacy.requests] == ["/model_info", "/get_model_info"]


# ----------------------------------------------------------------------- malformed bodies


def mutated(fixture: str, change: Callable[[dict[str, Any]], None]) -> bytes:
    obj = fixture_json(fixture)
    change(obj)
    return json.dumps(obj).encode()


def _drop_meta(o: dict[str, Any]) -> None:
    del o["meta_info"]


def _shift_ids(o: dict[str, Any]) -> None:
    o["output_ids"] = o["output_ids"][:-1]


def _bad_entry(o: dict[str, Any]) -> None:
    o["meta_info"]["output_token_logprobs"][0] = [-0.1]


def _null_finish(o: dict[str, Any]) -> None:
    o["meta_info"]["finish_reason"] = None


def _unknown_finish(o: dict[str, Any]) -> None:
    o["meta_info"]["finish_reason"] = {"type": "exploded"}


def _string_id(o: dict[str, Any]) -> None:
    o["meta_info"]["output_token_logprobs"][1][1] = "198"


def _bool_id(o: dict[str, Any]) -> None:
    o["meta_info"]["output_token_logprobs"][-1][1] = True


def _null_logprob(o: dict[str, Any]) -> None:
    o["meta_info"]["output_token_logprobs"][-1][0] = None


def _bool_logprob(o: dict[str, Any]) -> None:
    o["meta_info"]["output_token_logprobs"][0][0] = False


def _bool_output_id(o: dict[str, Any]) -> None:
    o["output_ids"][0] = True


@pytest.mark.parametrize(
    ("content", "text"),
    [
        (b"<html>502 Bad Gateway</html>", "not valid JSON"),
        (b'["not", "an", "object"]', "expected a JSON object"),
        (mutated("sglang_generate_stop_eos.json", _drop_meta), "meta_info"),
        (mutated("sglang_generate_stop_eos.json", _shift_ids), "disagree"),
        (mutated("sglang_generate_stop_eos.json", _bad_entry), r"\[logprob, token_id, text\]"),
        (mutated("sglang_generate_stop_eos.json", _null_finish), "finish_reason null"),
        (mutated("sglang_generate_stop_eos.json", _unknown_finish), "unknown finish type"),
        (mutated("sglang_generate_stop_eos.json", _string_id), "expected an integer"),
        (
            mutated("sglang_generate_stop_eos.json", _bool_id),
            r"\[1\]\): expected an integer, got True",
        ),
        (
            mutated("sglang_generate_stop_eos.json", _null_logprob),
            r"\[0\]\): expected a number, got None",
        ),
        (
            mutated("sglang_generate_stop_eos.json", _bool_logprob),
            r"logprobs\[0\]\[0\]\): expected a number, got False",
        ),
        (
            mutated("sglang_generate_stop_eos.json", _bool_output_id),
            r"output_ids\[0\]\): expected an integer, got True",
        ),
    ],
)
async def test_malformed_bodies_raise_engine_error(content: bytes, text: str) -> None:
    server = Server({"/generate": (200, content, "application/json")})
    async with client_for(server) as client:
        with pytest.raises(EngineError, match=text) as info:
            await client.generate(GenerateRequest(input_ids=(1,)))
    assert not isinstance(info.value, EngineHTTPError)
    assert len(server.requests) == 1  # a bad 200 body is not retried


async def test_unknown_fields_are_tolerated() -> None:
    def add_unknown(o: dict[str, Any]) -> None:
        o["prompt_token_ids"] = [1, 2, 3]
        o["meta_info"].update(
            {"spec_accept_rate": 0.8, "routed_experts": "AAAA", "dp_rank": 1, "new_field": {}}
        )

    content = mutated("sglang_generate_stop_eos.json", add_unknown)
    server = Server({"/generate": (200, content, "application/json")})
    async with client_for(server) as client:
        result = await client.generate(GenerateRequest(input_ids=(1,) * 812, rid="ep42-t3"))
    assert result.output_ids == ids_and_logprobs("sglang_generate_stop_eos.json")[0]
