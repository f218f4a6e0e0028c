"""Exactly one row per (prompt, sample), whatever one trajectory does.

The engine is the scripted test seam, the tokenizer, chat template and tools are real.
Each fault is injected for real inside the run: an engine call that raises a bug-type
exception, one that exhausts its retries, one that never answers (the trajectory deadline
cancels it), and a prompt longer than the context.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

from toolrollout._exceptions import EngineUnavailable
from toolrollout.engines import GenerateRequest
from toolrollout.rewards import numeric_match
from toolrollout.rollout import RolloutConfig, RolloutRunner, Trajectory, TrajectoryStatus
from toolrollout.testing import ScriptedEngine, ScriptedOutput
from toolrollout.tools import calculator_tool

TERMINAL = {"completed", "truncated", "aborted", "failed"}


def prompt(i: int, content: str | None = None) -> dict[str, Any]:
    text = content or f"What is {i} + 1?"
    return {"messages": [{"role": "user", "content": text}], "answer": str(i + 1)}


def faulty_engine(tokenizer: Any) -> ScriptedEngine:
    """Answers by the prompt's number: 3 -> bug, 5 -> engine gone, 7 -> hangs forever."""

    async def answer(request: GenerateRequest) -> ScriptedOutput:
        text = tokenizer.decode(list(request.input_ids))
        if "What is 3 +" in text:
            raise RuntimeError("a bug deep inside the engine adapter")
        if "What is 5 +" in text:
            raise EngineUnavailable("generate: gave up after 5 attempts; last error: reset")
        if "What is 7 +" in text:
            await anyio.sleep_forever()
        number = text.rsplit("What is ", 1)[1].split(" +")[0]
        out = tokenizer.encode(f"It is {int(number) + 1}.<|im_end|>", add_special_tokens=False)
        return ScriptedOutput(out, logprobs=[-0.1] * len(out))

    return ScriptedEngine(answer)


async def test_every_sample_gets_exactly_one_row(demo_tokenizer: Any) -> None:
    engine = faulty_engine(demo_tokenizer)
    config = RolloutConfig(n=3, trajectory_timeout=1.5, drift_check=False, context_length=200)
    runner = RolloutRunner(
        engine, demo_tokenizer, [calculator_tool()], config=config, rewards=[numeric_match]
    )
    prompts = [prompt(i) for i in range(10)]
    prompts[9] = prompt(9, "word " * 400)  # longer than the 200-token context
    streamed: list[Trajectory] = []
    started = time.monotonic()
    results = await runner.run(prompts, on_result=streamed.append)
    assert time.monotonic() - started < 10  # the hung engine call did not hang the run

    keys = [(t.prompt_index, t.sample_index) for t in results]
    assert keys == [(p, s) for p in range(10) for s in range(3)]
    assert sorted((t.prompt_index, t.sample_index) for t in streamed) == keys
    assert all(str(t.status) in TERMINAL for t in results)

    by_prompt = {p: [t for t in results if t.prompt_index == p] for p in range(10)}
    for t in by_prompt[3]:
        assert t.failed and t.finish_reason == "error" and t.reward is None
        assert t.error is not None and "RuntimeError: a bug deep inside" in t.error
    for t in by_prompt[5]:
        assert t.failed and t.error is not None and t.error.startswith("EngineUnavailable")
    for t in by_prompt[7]:
        assert t.failed and t.finish_reason == "timeout" and t.reward is None
        assert t.error is not None and "trajectory_timeout=1.5" in t.error
    for t in by_prompt[9]:
        assert t.failed and t.finish_reason == "overlong_prompt"
    healthy = [t for p in (0, 1, 2, 4, 6, 8) for t in by_prompt[p]]
    assert all(t.status is TrajectoryStatus.COMPLETED and t.reward == 1.0 for t in healthy)
    # Failed rows are flagged in the output columns, never a silent zero reward.
    for t in results:
        row = t.to_row()
        assert row["failed"] == (row["status"] == "failed")
        if row["failed"]:
            assert row["reward"] is None and row["error"]


async def test_skip_runs_only_the_missing_samples(demo_tokenizer: Any) -> None:
    engine = faulty_engine(demo_tokenizer)
    runner = RolloutRunner(
        engine, demo_tokenizer, [calculator_tool()], config=RolloutConfig(n=2, drift_check=False)
    )
    done = {(0, 0), (0, 1), (2, 1)}
    results = await runner.run(
        [prompt(0), prompt(1), prompt(2)], group_ids=["g0", "g1", "g2"], skip=done
    )
    assert [(t.prompt_index, t.sample_index) for t in results] == [(1, 0), (1, 1), (2, 0)]
    assert [t.uid for t in results] == ["g1-0", "g1-1", "g2-0"]
    assert len(engine.requests) == 3


def test_trajectory_timeout_must_be_positive() -> None:
    from toolrollout._exceptions import UserError

    with pytest.raises(UserError, match="trajectory_timeout"):
        RolloutConfig(trajectory_timeout=0)
