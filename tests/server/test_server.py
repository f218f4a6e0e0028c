"""``toolrollout serve`` speaks SGLang's native API: paths, shapes, errors, abort, streaming."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from toolrollout.apps.server import create_app
from toolrollout.engines._types import GenerateRequest, SamplingParams
from toolrollout.engines.embedded import EmbeddedEngine

META_KEYS = [
    "id",
    "finish_reason",
    "prompt_tokens",
    "weight_version",
    "num_retractions",
    "reasoning_tokens",
    "completion_tokens",
    "cached_tokens",
    "weight_versions",
    "e2e_latency",
    "response_sent_to_client_ts",
]
LOGPROB_KEYS = ["input_token_logprobs", "output_token_logprobs", "output_token_logprobs_length"]


@pytest.fixture(scope="module")
def engine(tiny_model_path: Path) -> Iterator[EmbeddedEngine]:
    eng = EmbeddedEngine(tiny_model_path, max_batch_size=8, num_threads=1)
    asyncio.run(eng.start())
    yield eng
    asyncio.run(eng.aclose())


@pytest.fixture(scope="module")
def app(engine: EmbeddedEngine) -> FastAPI:
    return create_app(engine)


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        yield c


class _ServerThread:
    """uvicorn on a free localhost port, in a background thread with its own loop."""

    def __init__(self, app: FastAPI) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", timeout_keep_alive=5)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> _ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


@pytest.fixture(scope="module")
def live_server(app: FastAPI) -> Iterator[_ServerThread]:
    with _ServerThread(app) as server:
        yield server


def greedy(max_new_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"max_new_tokens": max_new_tokens, "temperature": 0, **extra}


async def wait_until(predicate: Any, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


# ---------------------------------------------------------------------------- /generate
async def test_single_input_ids_response_shape(
    client: httpx.AsyncClient, engine: EmbeddedEngine
) -> None:
    expected = await engine.generate(
        GenerateRequest(
            input_ids=(5, 6, 7), sampling=SamplingParams(max_new_tokens=6, temperature=0)
        )
    )
    r = await client.post(
        "/generate", json={"input_ids": [5, 6, 7], "rid": "one", "sampling_params": greedy(6)}
    )
    assert r.status_code == 200
    body = r.json()
    assert list(body) == ["text", "output_ids", "meta_info"]
    meta = body["meta_info"]
    assert list(meta) == META_KEYS
    assert meta["id"] == "one"
    assert body["output_ids"] == list(expected.output_ids)
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert meta["prompt_tokens"] == 3 and meta["completion_tokens"] == 6
    assert meta["weight_version"] == "default" and meta["cached_tokens"] == 0
    assert meta["e2e_latency"] > 0
    put = await client.put("/generate", json={"input_ids": [5, 6, 7], "sampling_params": greedy(6)})
    assert put.status_code == 200 and put.json()["output_ids"] == body["output_ids"]


async def test_text_is_tokenized_without_a_template(
    client: httpx.AsyncClient, engine: EmbeddedEngine
) -> None:
    text = "Hello world"
    by_text = (
        await client.post("/generate", json={"text": text, "sampling_params": greedy(5)})
    ).json()
    ids = engine.tokenize(text)
    by_ids = (
        await client.post("/generate", json={"input_ids": ids, "sampling_params": greedy(5)})
    ).json()
    assert by_text["meta_info"]["prompt_tokens"] == len(ids)
    assert by_text["output_ids"] == by_ids["output_ids"]
    assert by_text["text"] == by_ids["text"]


async def test_batch_keeps_input_order_and_suffixes_rids(client: httpx.AsyncClient) -> None:
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    singles = [
        (
            await client.post("/generate", json={"input_ids": p, "sampling_params": greedy(3 + i)})
        ).json()
        for i, p in enumerate(prompts)
    ]
    r = await client.post(
        "/generate",
        json={
            "input_ids": prompts,
            "rid": "batch",
            "sampling_params": [greedy(3 + i) for i in range(3)],
        },
    )
    assert r.status_code == 200
    batch = r.json()
    assert isinstance(batch, list) and len(batch) == 3
    assert [b["meta_info"]["id"] for b in batch] == ["batch_0", "batch_1", "batch_2"]
    assert [b["output_ids"] for b in batch] == [s["output_ids"] for s in singles]
    texts = await client.post(
        "/generate",
        json={
            "text": ["Hello world", "The quick brown"],
            "rid": ["a", "b"],
            "sampling_params": greedy(2),
        },
    )
    assert [b["meta_info"]["id"] for b in texts.json()] == ["a", "b"]


async def test_n_returns_n_samples_with_fresh_rids(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/generate",
        json={
            "input_ids": [5, 6, 7],
            "rid": "mine",
            "sampling_params": {"max_new_tokens": 4, "n": 3},
        },
    )
    samples = r.json()
    assert isinstance(samples, list) and len(samples) == 3
    rids = {s["meta_info"]["id"] for s in samples}
    assert len(rids) == 3 and "mine" not in rids  # SGLang gives each sample a new uuid
    assert all(s["meta_info"]["completion_tokens"] <= 4 for s in samples)


async def test_logprob_fields(client: httpx.AsyncClient, engine: EmbeddedEngine) -> None:
    r = await client.post(
        "/generate",
        json={
            "input_ids": [5, 6, 7, 8],
            "sampling_params": greedy(4, ignore_eos=True),
            "return_logprob": True,
            "logprob_start_len": 0,
            "top_logprobs_num": 2,
            "return_text_in_logprobs": True,
        },
    )
    body = r.json()
    meta = body["meta_info"]
    assert list(meta) == [
        *META_KEYS[:5],
        *LOGPROB_KEYS,
        "input_top_logprobs",
        "output_top_logprobs",
        *META_KEYS[5:],
    ]
    assert [e[1] for e in meta["input_token_logprobs"]] == [5, 6, 7, 8]
    assert meta["input_token_logprobs"][0][0] is None
    assert meta["input_top_logprobs"][0] is None
    outputs = meta["output_token_logprobs"]
    assert [e[1] for e in outputs] == body["output_ids"]
    assert meta["output_token_logprobs_length"] == len(body["output_ids"]) == 4
    decode = engine.tokenizer.decode
    for (lp, tid, text), top in zip(outputs, meta["output_top_logprobs"], strict=True):
        assert lp <= 0 and text == decode([tid])
        assert len(top) == 2 and top[0][1] == tid and top[0][0] == pytest.approx(lp)
    plain = (
        await client.post(
            "/generate",
            json={"input_ids": [5, 6, 7, 8], "sampling_params": greedy(4), "return_logprob": True},
        )
    ).json()["meta_info"]
    assert plain["input_token_logprobs"] == []  # logprob_start_len defaults to -1
    assert all(e[2] is None for e in plain["output_token_logprobs"])


async def test_stop_trimming_follows_sglang_defaults(
    client: httpx.AsyncClient, engine: EmbeddedEngine
) -> None:
    free = (
        await client.post("/generate", json={"input_ids": [5, 6, 7], "sampling_params": greedy(10)})
    ).json()
    stop_id = next(
        t for i, t in enumerate(free["output_ids"]) if i >= 2 and t not in free["output_ids"][:i]
    )
    k = free["output_ids"].index(stop_id)
    params = greedy(10, stop_token_ids=[stop_id], skip_special_tokens=False)
    trimmed = (
        await client.post("/generate", json={"input_ids": [5, 6, 7], "sampling_params": params})
    ).json()
    kept = (
        await client.post(
            "/generate",
            json={"input_ids": [5, 6, 7], "sampling_params": {**params, "no_stop_trim": True}},
        )
    ).json()
    decode = engine.tokenizer.decode
    assert trimmed["output_ids"] == kept["output_ids"] == free["output_ids"][: k + 1]
    assert trimmed["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}
    assert trimmed["text"] == decode(free["output_ids"][:k])
    assert kept["text"] == decode(free["output_ids"][: k + 1])


# ---------------------------------------------------------------------------- streaming
def sse_events(raw: bytes) -> list[str]:
    assert raw.endswith(b"\n\n")
    events = raw.decode().split("\n\n")[:-1]
    assert all(e.startswith("data: ") for e in events), events
    return [e[len("data: ") :] for e in events]


async def test_stream_is_cumulative_sse_ending_with_done(client: httpx.AsyncClient) -> None:
    final = (
        await client.post("/generate", json={"input_ids": [5, 6, 7], "sampling_params": greedy(8)})
    ).json()
    r = await client.post(
        "/generate",
        json={
            "input_ids": [5, 6, 7],
            "stream": True,
            "sampling_params": greedy(8),
            "return_logprob": True,
        },
    )
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.content)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len(chunks) >= 2
    for chunk in chunks:
        n = len(chunk["output_ids"])
        assert chunk["output_ids"] == final["output_ids"][:n]  # cumulative, not deltas
        assert len(chunk["meta_info"]["output_token_logprobs"]) == n
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    assert "e2e_latency" not in chunks[0]["meta_info"]
    stamped = ["response_sent_to_client_ts" in c["meta_info"] for c in chunks]
    assert stamped == [True] + [False] * (len(chunks) - 1)  # once per request, as SGLang
    last = chunks[-1]
    assert last["output_ids"] == final["output_ids"] and last["text"] == final["text"]
    assert last["meta_info"]["finish_reason"] == {"type": "length", "length": 8}
    assert "e2e_latency" in last["meta_info"]


async def test_batch_stream_chunks_carry_index(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/generate",
        json={
            "input_ids": [[5, 6], [7, 8, 9]],
            "stream": True,
            "sampling_params": [greedy(3), greedy(5)],
        },
    )
    events = sse_events(r.content)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    finals = {c["index"]: c for c in chunks if c["meta_info"]["finish_reason"] is not None}
    assert set(finals) == {0, 1}
    assert len(finals[0]["output_ids"]) == 3 and len(finals[1]["output_ids"]) == 5


# ---------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {"input_ids": [1] * 300, "sampling_params": {"max_new_tokens": 1}},
            "The input (300 tokens) is longer than the model's context length (256 tokens).",
        ),
        (
            {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 255}},
            "Requested token count exceeds the model's maximum context length of 256 tokens. "
            "You requested a total of 257 tokens: 2 tokens from the input messages and 255 "
            "tokens for the completion. Please reduce the number of tokens in the input "
            "messages or the completion to fit within the limit.",
        ),
        (
            {"input_ids": [1, 2], "sampling_params": {"temperature": -0.5}},
            "temperature must be a non-negative finite number, got -0.5.",
        ),
        (
            {"input_ids": [1, 2], "sampling_params": {"top_p": 0}},
            "top_p must be in (0, 1], got 0.0.",
        ),
        (
            {"input_ids": [1, 2], "sampling_params": {"top_k": 0}},
            "top_k must be -1 (disable) or at least 1, got 0.",
        ),
        ({"sampling_params": {}}, "Either text, input_ids or input_embeds should be provided."),
        ({"input_ids": []}, "input_ids cannot be empty."),
        (
            {"input_ids": [1, 2], "sampling_params": {"max_tokens": 5}},
            "sampling_params: unexpected keyword argument 'max_tokens'",
        ),
        (
            {"input_ids": [[1], [2]], "rid": ["x", "x"]},
            "Duplicate request IDs detected within the request: ['x']",
        ),
    ],
)
async def test_bad_requests_get_sglangs_400(
    client: httpx.AsyncClient, body: dict[str, Any], message: str
) -> None:
    r = await client.post("/generate", json=body)
    assert r.status_code == 400
    assert r.json() == {"error": {"message": message}}


async def test_image_data_is_refused_for_a_text_model(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/generate", json={"input_ids": [1, 2], "image_data": "data:image/png;base64,iVBORw0KGgo="}
    )
    assert r.status_code == 400
    assert "no image understanding" in r.json()["error"]["message"]


async def test_malformed_bodies_get_the_validation_error_shape(client: httpx.AsyncClient) -> None:
    for content in (b'{"input_ids": [1, 2', b"[1, 2]", b'{"input_ids": "abc"}'):
        r = await client.post(
            "/generate", content=content, headers={"content-type": "application/json"}
        )
        assert r.status_code == 400
        body = r.json()
        assert set(body) == {"object", "message", "type", "param", "code"}
        assert body["object"] == "error" and body["code"] == 400 and body["message"]


async def test_streaming_errors_arrive_as_a_chunk(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/generate",
        json={"input_ids": [1, 2], "stream": True, "sampling_params": {"max_new_tokens": 999}},
    )
    assert r.status_code == 200  # SGLang validates inside the stream
    events = sse_events(r.content)
    assert events[-1] == "[DONE]"
    error = json.loads(events[0])["error"]
    assert error["message"].startswith("Requested token count exceeds")
    assert error["code"] == 400


async def test_server_keeps_serving_after_bad_requests(client: httpx.AsyncClient) -> None:
    for body in (
        {"input_ids": [1] * 400},
        {"text": 5},
        {},
        {"input_ids": [1], "sampling_params": {"n": 0}},
    ):
        assert (await client.post("/generate", json=body)).status_code == 400
    ok = await client.post("/generate", json={"input_ids": [1, 2], "sampling_params": greedy(2)})
    assert ok.status_code == 200 and len(ok.json()["output_ids"]) == 2


# ---------------------------------------------------------------------------- abort
async def test_abort_request_returns_partial_output(
    client: httpx.AsyncClient, engine: EmbeddedEngine
) -> None:
    body = {
        "input_ids": [5, 6, 7],
        "rid": "rollout-3-turn-1",
        "sampling_params": greedy(240, ignore_eos=True),
    }
    # The abort must land while the request runs with some output. On a loaded machine
    # 240 tokens can be done before the test's next poll, so the engine is frozen in
    # place as soon as output appears (one decode step can still slip through: then the
    # request finished by length before the freeze, and the attempt is repeated).
    # The engine is shared by the module, and the condition below counts any running row:
    # each attempt starts on an idle engine, else a row left by an earlier request meets it
    # before this one is even submitted, and the pause then holds this one at the gate
    # (never submitted: the abort finds nothing, and the wait below times out). Idle means
    # no row either: the scheduler forgets a request (num_active) and delivers its result
    # before it drops its row from the batch (num_running).
    for _attempt in range(5):
        await wait_until(
            lambda: engine.num_active == engine.num_running == engine.num_waiting == 0,
            within=60.0,
        )
        pending = asyncio.create_task(client.post("/generate", json=body))
        await wait_until(
            lambda p=pending: p.done() or (engine.num_running == 1 and engine.num_tokens > 3)
        )
        await engine.pause_generation("in_place")
        try:
            r = await client.post("/abort_request", json={"rid": "rollout-3", "abort_all": False})
            assert r.status_code == 200
            result = (await asyncio.wait_for(pending, 30)).json()
        finally:
            await engine.continue_generation()
        meta = result["meta_info"]
        if meta["finish_reason"]["type"] != "length":
            break
    assert meta["finish_reason"] == {
        "type": "abort",
        "message": "Aborted",
        "status_code": None,
        "err_type": None,
    }
    assert 0 < meta["completion_tokens"] < 240
    assert len(result["output_ids"]) == meta["completion_tokens"]


async def test_abort_all_and_abort_in_waiting_queue(tiny_model_path: Path) -> None:
    async with EmbeddedEngine(tiny_model_path, max_batch_size=1, num_threads=1) as eng:
        transport = httpx.ASGITransport(app=create_app(eng))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            long = {
                "input_ids": [5, 6],
                "sampling_params": greedy(240, ignore_eos=True),
                "return_logprob": True,
            }
            first = asyncio.create_task(c.post("/generate", json={**long, "rid": "a"}))
            await wait_until(lambda: eng.num_running == 1)
            second = asyncio.create_task(c.post("/generate", json={**long, "rid": "b"}))
            await wait_until(lambda: eng.num_waiting == 1)
            load = (await c.get("/get_load")).json()
            assert load == [
                {
                    "dp_rank": 0,
                    "num_reqs": 2,
                    "num_waiting_reqs": 1,
                    "num_tokens": load[0]["num_tokens"],
                }
            ]
            assert (await c.post("/abort_request", json={"abort_all": True})).status_code == 200
            waited = (await second).json()
            assert waited["output_ids"] == []
            assert list(waited["meta_info"]) == [
                "id", "finish_reason", "weight_version", "e2e_latency", "weight_versions",
                *LOGPROB_KEYS,
                "completion_tokens", "response_sent_to_client_ts",
            ]  # fmt: skip
            assert waited["meta_info"]["finish_reason"] == {
                "type": "abort",
                "message": "Abort in waiting queue",
            }
            ran = (await first).json()
            assert ran["meta_info"]["finish_reason"]["type"] == "abort"


# ---------------------------------------------------------------------------- other endpoints
async def test_health_and_info_endpoints(client: httpx.AsyncClient, engine: EmbeddedEngine) -> None:
    assert (await client.get("/health")).status_code == 200
    assert (await client.get("/health_generate")).status_code == 200
    info = (await client.get("/model_info")).json()
    assert info == (await client.get("/get_model_info")).json()
    assert list(info) == [
        "model_path", "tokenizer_path", "is_generation", "preferred_sampling_params",
        "weight_version", "has_image_understanding", "has_audio_understanding",
        "model_type", "architectures",
    ]  # fmt: skip
    assert info["model_type"] == "qwen2" and info["architectures"] == ["Qwen2ForCausalLM"]
    assert info["is_generation"] is True and info["has_image_understanding"] is False
    server = (await client.get("/server_info")).json()
    assert server == {
        **(await client.get("/get_server_info")).json(),
        "internal_states": server["internal_states"],
    }
    assert server["context_length"] == 256 and server["dp_size"] == 1
    assert server["model_path"] == engine.model_path and server["version"]
    assert server["max_total_num_tokens"] == 8 * 256
    loads = (await client.get("/v1/loads")).json()
    assert loads["loads"][0]["dp_rank"] == 0
    models = (await client.get("/v1/models")).json()
    assert models["data"][0]["max_model_len"] == 256
    for method in ("GET", "POST"):
        flushed = await client.request(method, "/flush_cache")
        assert flushed.status_code == 200 and flushed.text.startswith("Cache flushed.")


async def test_update_weight_version(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/update_weight_version", json={"new_version": "step-9", "abort_all_requests": False}
    )
    assert r.json() == {
        "success": True,
        "message": "Weight version updated to step-9",
        "new_version": "step-9",
    }
    try:
        out = (
            await client.post("/generate", json={"input_ids": [1], "sampling_params": greedy(1)})
        ).json()
        assert out["meta_info"]["weight_version"] == "step-9"
        assert (await client.get("/get_weight_version")).json() == {"weight_version": "step-9"}
    finally:
        await client.post("/update_weight_version", json={"new_version": "default"})


# ---------------------------------------------------------------------------- real sockets
async def test_end_to_end_over_a_real_socket(
    live_server: _ServerThread, engine: EmbeddedEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with httpx.AsyncClient(base_url=live_server.url, timeout=30) as c:
        assert (await c.get("/health")).status_code == 200
        single = (
            await c.post("/generate", json={"input_ids": [5, 6, 7], "sampling_params": greedy(5)})
        ).json()
        assert len(single["output_ids"]) == 5
        async with c.stream(
            "POST",
            "/generate",
            json={"input_ids": [5, 6, 7], "stream": True, "sampling_params": greedy(5)},
        ) as r:
            chunks = [line[len("data: ") :] async for line in r.aiter_lines() if line.strip()]
        assert chunks[-1] == "[DONE]"
        assert json.loads(chunks[-2])["output_ids"] == single["output_ids"]

        # Slowed down, so that the abort lands before the 240 tokens are done even on a
        # quiet machine (unslowed, the tiny model can finish them first: 'length').
        model = engine._model
        assert model is not None
        original = model.forward

        def slow(*args: Any, **kwargs: Any) -> Any:
            time.sleep(0.02)
            return original(*args, **kwargs)

        monkeypatch.setattr(model, "forward", slow)
        body = {"input_ids": [5, 6], "rid": "live", "sampling_params": greedy(240, ignore_eos=True)}
        pending = asyncio.create_task(c.post("/generate", json=body))
        await wait_until(lambda: engine.num_running == 1)
        # An abort for a rid the server has not registered yet is a no-op (as in SGLang), and
        # the scheduler can count the row before the server maps its rid (seen once in CI,
        # 2026-12: 'length'): repeat the abort until the request ends; its 240 slowed tokens
        # take at least 4.8 s, so the request cannot end by length first.
        while not pending.done():
            assert (await c.post("/abort_request", json={"rid": "live"})).status_code == 200
            await asyncio.wait({pending}, timeout=0.2)
        aborted = (await pending).json()
        assert aborted["meta_info"]["finish_reason"]["type"] == "abort"
        bad = await c.post("/generate", json={"input_ids": [1] * 999})
        assert bad.status_code == 400 and "error" in bad.json()
        assert (
            await c.post("/generate", json={"input_ids": [1], "sampling_params": greedy(1)})
        ).status_code == 200


async def test_client_disconnect_aborts_the_request(
    live_server: _ServerThread, engine: EmbeddedEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = engine._model
    assert model is not None
    original = model.forward

    def slow(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.02)  # a 240-token request now needs about 5 s to finish by itself
        return original(*args, **kwargs)

    monkeypatch.setattr(model, "forward", slow)
    long = {"input_ids": [5, 6], "sampling_params": greedy(240, ignore_eos=True)}
    async with httpx.AsyncClient(base_url=live_server.url, timeout=30) as c:
        async with c.stream("POST", "/generate", json={**long, "stream": True}) as r:
            async for _ in r.aiter_lines():
                break  # read one chunk, then hang up
    await wait_until(lambda: engine.num_active == 0, within=2.5)

    async with httpx.AsyncClient(base_url=live_server.url, timeout=30) as c:
        task = asyncio.create_task(c.post("/generate", json=long))
        await wait_until(lambda: engine.num_running == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    await wait_until(lambda: engine.num_active == 0, within=3.0)  # polled once a second


# ---------------------------------------------------------------------------- CLI
def test_cli_serve_wires_run_server(monkeypatch: pytest.MonkeyPatch, tiny_model_path: Path) -> None:
    from typer.testing import CliRunner

    import toolrollout.apps.demo
    import toolrollout.apps.server
    from toolrollout.apps.cli import app, main

    calls: list[tuple[Any, ...]] = []

    def fake_run_server(*args: Any, **kwargs: Any) -> None:
        calls.append((args, kwargs))

    monkeypatch.setattr(toolrollout.apps.server, "run_server", fake_run_server)
    runner = CliRunner()
    result = runner.invoke(
        app, ["serve", "--model", str(tiny_model_path), "--port", "31234", "--max-batch-size", "4"]
    )
    assert result.exit_code == 0, result.output
    ((args, kwargs),) = calls
    assert args == (tiny_model_path, "127.0.0.1", 31234)
    assert kwargs["max_batch_size"] == 4
    assert callable(main)

    monkeypatch.setattr(toolrollout.apps.demo, "DEMO_MODEL_PATH", tiny_model_path.parent / "absent")
    missing = runner.invoke(app, ["serve"])
    assert missing.exit_code == 2 and "demo model is missing" in missing.output
    monkeypatch.setattr(toolrollout.apps.demo, "DEMO_MODEL_PATH", tiny_model_path)
    assert runner.invoke(app, ["serve"]).exit_code == 0
    assert calls[-1][0][0] == tiny_model_path
