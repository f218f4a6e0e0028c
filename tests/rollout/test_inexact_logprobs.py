"""A run asks its engine once whether its logprobs are the checkpoint's, and refuses or labels.

The engine side is scripted here (``ScriptedEngine(logprob_mismatch=...)``); the SGLang
client's own answer is checked against real servers in
tests/real_engines/sglang/test_logprob_check.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from toolrollout.apps.cli._options import RUN, user_message
from toolrollout.exceptions import InexactLogprobsError, UserError
from toolrollout.rollout import RolloutConfig, RolloutRunner
from toolrollout.testing import ScriptedEngine, ScriptedOutput

REASON = "http://gpu0:30000 serves the float32 checkpoint /ckpt in float16 (--dtype auto), ..."
PROMPT = [{"role": "user", "content": "What is 6 * 7?"}]


def scripted(tokenizer: Any, samples: int, reason: str | None) -> ScriptedEngine:
    out = tokenizer.encode("42<|im_end|>", add_special_tokens=False)
    steps = [ScriptedOutput(out, logprobs=[-0.5] * len(out)) for _ in range(samples)]
    return ScriptedEngine(steps, logprob_mismatch=reason)


async def test_a_run_is_refused_with_the_engine_s_reason(demo_tokenizer: Any) -> None:
    engine = scripted(demo_tokenizer, 1, REASON)
    runner = RolloutRunner(engine, demo_tokenizer, [])
    with pytest.raises(InexactLogprobsError) as raised:
        await runner.run([PROMPT])
    message = str(raised.value)
    assert REASON in message and "set config.inexact_logprobs to 'label'" in message
    assert "\n" not in message and "--" not in message.removeprefix(REASON)
    # The CLI names the field by the flag that sets it.
    shown = user_message(raised.value, RUN.values())
    assert "set --inexact-logprobs to 'label'" in shown
    assert isinstance(raised.value, UserError)  # the caller's setting to change
    assert engine.requests == []  # refused before anything ran


async def test_labelled_runs_carry_the_reason_on_every_row(demo_tokenizer: Any) -> None:
    engine = scripted(demo_tokenizer, 3, REASON)
    config = RolloutConfig(n=3, inexact_logprobs="label")
    trajectories = await RolloutRunner(engine, demo_tokenizer, [], config=config).run([PROMPT])
    assert len(trajectories) == 3
    assert all(t.metrics["logprob_mismatch"] == REASON for t in trajectories)


async def test_exact_logprobs_leave_rows_unlabelled(demo_tokenizer: Any) -> None:
    engine = scripted(demo_tokenizer, 1, None)
    (trajectory,) = await RolloutRunner(engine, demo_tokenizer, []).run([PROMPT])
    assert "logprob_mismatch" not in trajectory.metrics


def test_the_policy_is_checked() -> None:
    with pytest.raises(UserError, match="inexact_logprobs must be 'refuse' or 'label'"):
        RolloutConfig(inexact_logprobs="ignore")  # type: ignore[arg-type]
