"""A run is refused when SGLang's logprobs are not the float32 checkpoint's (``--dtype``).

SGLang's default ``--dtype auto`` serves the float32 demo checkpoint in float16: measured
here, its logprobs then differ from a float32 recompute by far more than parity allows,
``SGLangClient.logprob_mismatch`` says so in one line naming ``--dtype float32``, and a
run refuses to start (or labels every row, when asked to).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import pytest

from tests.real_engines.sglang._launch import LIMIT, SGLangServer
from tests.real_engines.sglang._parity import recomputed_logprobs
from tests.real_engines.sglang._prompts import chat_ids, tokenizer
from toolrollout.engines import GenerateRequest, SamplingParams, SGLangClient
from toolrollout.exceptions import InexactLogprobsError
from toolrollout.rollout import RolloutConfig, RolloutRunner
from toolrollout.tools import calculator_tool

pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(LIMIT)]

PROMPT = [{"role": "user", "content": "What is 17 * 23?"}]


@pytest.fixture(scope="module")
def sglang_auto(
    start_sglang: Callable[..., AbstractContextManager[SGLangServer]],
) -> Iterator[SGLangServer]:
    """The demo model with SGLang's default ``--dtype auto`` (float16 for it)."""
    with start_sglang(dtype="auto") as server:
        yield server


async def max_logprob_error(url: str) -> float:
    ids = chat_ids("What is 17 * 23?")
    async with SGLangClient(url) as client:
        result = await client.generate(
            GenerateRequest(input_ids=ids, sampling=SamplingParams(max_new_tokens=48))
        )
    assert result.output_logprobs is not None
    expected = recomputed_logprobs(ids, result.output_ids)
    return max(abs(a - b) for a, b in zip(result.output_logprobs, expected, strict=True))


async def test_float16_serving_is_detected_and_measurably_off(sglang_auto: SGLangServer) -> None:
    async with SGLangClient(sglang_auto.url) as client:
        reason = await client.logprob_mismatch(SamplingParams())
        (served,) = (await client.info()).servers
        flag = (await client.server_info())["dtype"]
    assert (flag, served.dtype) == ("auto", "float16")  # the flag, and what output files record
    assert reason is not None and "\n" not in reason
    assert "in float16 (--dtype auto)" in reason and "--dtype float32" in reason
    assert sglang_auto.url in reason
    assert await max_logprob_error(sglang_auto.url) > 1e-3  # what the check guards against


async def test_float32_serving_passes_and_is_exact(sglang_fp32: SGLangServer) -> None:
    async with SGLangClient(sglang_fp32.url) as client:
        assert await client.logprob_mismatch(SamplingParams(temperature=0.7, top_p=0.9)) is None
    assert await max_logprob_error(sglang_fp32.url) < 1e-4


async def test_a_run_on_float16_is_refused_in_one_line(sglang_auto: SGLangServer) -> None:
    async with SGLangClient(sglang_auto.url) as client:
        runner = RolloutRunner(client, tokenizer(), [calculator_tool()])
        with pytest.raises(InexactLogprobsError, match=r"--dtype float32 \(or set") as raised:
            await runner.run([PROMPT])
    assert "\n" not in str(raised.value)


async def test_a_labelled_run_on_float16_marks_every_row(sglang_auto: SGLangServer) -> None:
    config = RolloutConfig(
        n=2, sampling=SamplingParams(max_new_tokens=64), max_turns=2, inexact_logprobs="label"
    )
    async with SGLangClient(sglang_auto.url) as client:
        runner = RolloutRunner(client, tokenizer(), [calculator_tool()], config=config)
        trajectories = await runner.run([PROMPT])
    assert len(trajectories) == 2
    assert all("--dtype float32" in t.metrics["logprob_mismatch"] for t in trajectories)
