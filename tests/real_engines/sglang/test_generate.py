"""The data plane the SGLang client relies on, against the real server (sglang 0.5.23).

Each test asserts what toolrollout's ``SGLangClient`` and wire code assume of SGLang's
``/generate``: ids and logprobs, finish reasons, streaming, overlong prompts, health and
the info and load fields it reads.
"""

from __future__ import annotations

import itertools
import math
from contextlib import aclosing

import httpx
import pytest

from tests.real_engines.sglang._launch import DEMO_MODEL, LIMIT, SGLangServer
from tests.real_engines.sglang._prompts import chat_ids, tokenizer
from toolrollout.engines import GenerateRequest, SamplingParams, SGLangClient
from toolrollout.exceptions import OverlongPromptError

pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(LIMIT)]

EOS = 2  # the demo model's <|im_end|>


def request(question: str = "What is 6 * 7?", **sampling: object) -> GenerateRequest:
    params = {"max_new_tokens": 48, **sampling}
    return GenerateRequest(input_ids=chat_ids(question), sampling=SamplingParams(**params))  # type: ignore[arg-type]


async def test_greedy_is_reproducible_and_stops_on_eos(sglang_fp32: SGLangServer) -> None:
    async with SGLangClient(sglang_fp32.url) as client:
        first = await client.generate(request(temperature=0.0, max_new_tokens=200))
        second = await client.generate(request(temperature=0.0, max_new_tokens=200))
    assert first.output_ids == second.output_ids
    assert first.output_logprobs == pytest.approx(second.output_logprobs, abs=1e-5)
    # The demo model answers and ends its turn: the stop token is kept in the ids (no_stop_trim).
    assert first.finish_reason.type == "stop"
    assert first.finish_reason.matched == EOS
    assert first.output_ids[-1] == EOS
    assert first.completion_tokens == len(first.output_ids)


async def test_the_logprob_layout(sglang_fp32: SGLangServer) -> None:
    """One logprob per output id, the ids in ``output_token_logprobs`` equal ``output_ids``."""
    ids = chat_ids("What is 12 + 30?")
    body = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": 16, "temperature": 1.0, "no_stop_trim": True},
        "return_logprob": True,
        "logprob_start_len": -1,
    }
    async with httpx.AsyncClient(timeout=60) as http:
        data = (await http.post(sglang_fp32.url + "/generate", json=body)).json()
    meta = data["meta_info"]
    entries = meta["output_token_logprobs"]
    assert [entry[1] for entry in entries] == data["output_ids"]
    assert len(entries) == meta["completion_tokens"] == meta["output_token_logprobs_length"]
    assert all(entry[0] <= 0.0 and entry[2] is None for entry in entries)
    assert meta["input_token_logprobs"] == []  # logprob_start_len -1: none for the prompt
    assert meta["prompt_tokens"] == len(ids)
    assert meta["weight_version"] == "default"
    assert set(meta) >= {"id", "finish_reason", "cached_tokens", "e2e_latency"}


async def test_sampling_ignores_the_seed_without_deterministic_inference(
    sglang_fp32: SGLangServer, caplog: pytest.LogCaptureFixture
) -> None:
    """SGLang reads ``sampling_seed`` only with ``--enable-deterministic-inference``
    (``sampling_batch_info.py``), which needs a GPU attention backend: on this server the
    same seed gives different samples, and the client says so once. ``toolrollout serve``
    honours it (docs/engines.md)."""
    async with SGLangClient(sglang_fp32.url) as client:
        server = await client.server_info()
        with caplog.at_level("WARNING", logger="toolrollout.engines.sglang"):
            samples = [await client.generate(request(temperature=1.0, seed=7)) for _ in range(3)]
    assert server["enable_deterministic_inference"] is False
    assert len({s.output_ids for s in samples}) > 1
    (warning,) = [r.getMessage() for r in caplog.records if "sampling_seed" in r.getMessage()]
    assert warning.startswith(f"{sglang_fp32.url} ignores sampling_seed")
    for sample in samples:
        assert sample.output_logprobs is not None
        assert len(sample.output_logprobs) == len(sample.output_ids)
        assert all(math.isfinite(x) and x <= 0.0 for x in sample.output_logprobs)


async def test_length_and_stop_token_finish_reasons(sglang_fp32: SGLangServer) -> None:
    async with SGLangClient(sglang_fp32.url) as client:
        length = await client.generate(request(temperature=0.0, max_new_tokens=3, ignore_eos=True))
        greedy = await client.generate(request(temperature=0.0, max_new_tokens=64))
        stop_id = greedy.output_ids[1]
        stopped = await client.generate(
            request(temperature=0.0, max_new_tokens=64, stop_token_ids=(stop_id,))
        )
    assert length.finish_reason.type == "length" and length.finish_reason.length == 3
    assert len(length.output_ids) == 3
    assert stopped.finish_reason.type == "stop" and stopped.finish_reason.matched == stop_id
    assert stopped.output_ids == greedy.output_ids[:2]  # the matched id is kept


async def test_stop_string_is_matched_as_text(sglang_fp32: SGLangServer) -> None:
    async with SGLangClient(sglang_fp32.url) as client:
        greedy = await client.generate(request(temperature=0.0, max_new_tokens=64))
        text = tokenizer().decode(list(greedy.output_ids[:4]))
        stop = text.strip()[-2:]
        stopped = await client.generate(request(temperature=0.0, max_new_tokens=64, stop=(stop,)))
    assert stopped.finish_reason.type == "stop" and stopped.finish_reason.matched == stop
    assert stopped.output_ids == greedy.output_ids[: len(stopped.output_ids)]


async def test_streaming_gives_the_same_sample(sglang_fp32: SGLangServer) -> None:
    async with SGLangClient(sglang_fp32.url) as client:
        whole = await client.generate(request(temperature=0.0))
        async with aclosing(client.stream(request(temperature=0.0))) as stream:
            chunks = [chunk async for chunk in stream]
    last = chunks[-1].result
    assert last is not None and last.output_ids == whole.output_ids
    assert last.output_logprobs == pytest.approx(whole.output_logprobs, abs=1e-5)
    assert len(chunks) > 2  # several chunks, each cumulative
    assert all(
        later.output_ids[: len(earlier.output_ids)] == earlier.output_ids
        for earlier, later in itertools.pairwise(chunks)
    )
    assert [i for c in chunks for i in c.new_ids] == list(whole.output_ids)


async def test_an_overlong_prompt_is_refused_with_overlong_prompt_error(
    sglang_fp32: SGLangServer,
) -> None:
    async with SGLangClient(sglang_fp32.url) as client:
        with pytest.raises(OverlongPromptError):
            await client.generate(
                GenerateRequest(input_ids=[5] * 1020, sampling=SamplingParams(max_new_tokens=64))
            )
        # the server keeps serving
        assert (await client.generate(request(temperature=0.0))).finish_reason.type == "stop"


async def test_health_info_and_loads(sglang_fp32: SGLangServer) -> None:
    async with SGLangClient(sglang_fp32.url) as client:
        await client.wait_healthy(timeout=30, path="/health_generate")
        await client.wait_healthy(timeout=30)
        info = await client.info()
        loads = await client.get_loads()
        server = await client.server_info()
    assert info.context_length == 1024  # --context-length
    assert info.model_path == str(DEMO_MODEL)
    assert info.weight_version == "default"
    assert info.vision is False
    (load,) = loads["loads"]
    assert {"num_running_reqs", "num_waiting_reqs", "token_usage", "max_total_num_tokens"} <= set(
        load
    )
    assert server["enable_priority_scheduling"] is True
    assert server["schedule_low_priority_values_first"] is False
    assert server["max_total_num_tokens"] == 8192
