"""Logprob parity, measured: a multi-turn tool-calling rollout on the real server, then
the same tokens teacher-forced through transformers in float32.

The demo model answers the bundled arithmetic prompts by calling the calculator over
several turns; every model token's rollout logprob must be within 1e-4 of the float32
recompute (measured: a few 1e-6). Later turns are served from SGLang's radix cache, so the
check covers cached prefixes too.
"""

from __future__ import annotations

import logging

import pytest

from tests.real_engines.sglang._launch import LIMIT, SGLangServer
from tests.real_engines.sglang._parity import recomputed_logprobs
from tests.real_engines.sglang._prompts import tokenizer
from toolrollout.apps.demo import load_demo_prompts
from toolrollout.engines import SamplingParams, SGLangClient
from toolrollout.rollout import RolloutConfig, RolloutRunner, TrajectoryStatus
from toolrollout.tools import calculator_tool

pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(LIMIT)]

TOLERANCE = 1e-4
logger = logging.getLogger(__name__)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
async def test_rollout_logprobs_match_a_float32_recompute(
    sglang_fp32: SGLangServer, temperature: float
) -> None:
    prompts = [row["messages"] for row in load_demo_prompts()[:6]]
    config = RolloutConfig(
        n=2, sampling=SamplingParams(max_new_tokens=96, temperature=temperature), max_turns=4
    )
    async with SGLangClient(sglang_fp32.url) as client:
        runner = RolloutRunner(client, tokenizer(), [calculator_tool()], config=config)
        trajectories = await runner.run(prompts)
    assert all(t.status is TrajectoryStatus.COMPLETED for t in trajectories), [
        (t.status, t.error) for t in trajectories
    ]
    multi_turn = [t for t in trajectories if t.num_tool_calls >= 1 and t.num_turns >= 2]
    assert len(multi_turn) >= len(trajectories) // 2  # tool results inside the transcripts
    worst, checked = 0.0, 0
    for t in trajectories:
        expected = recomputed_logprobs(t.prompt_ids, t.response_ids, temperature=temperature)
        for got, want, mask in zip(t.rollout_logprobs, expected, t.loss_mask, strict=True):
            if mask:
                worst = max(worst, abs(got - want))
                checked += 1
    logger.info(
        "T=%s: %d model tokens, max |rollout - recompute| = %.2e", temperature, checked, worst
    )
    assert checked > 100
    assert worst < TOLERANCE
