"""Custom environments as TrajectoryHooks subclasses, end to end through the real loop.

The engine is scripted; the tokenizer, chat template and token bookkeeping are the real
ones. A hook decides what the environment answers; the loop still appends it as one
template delta with loss mask 0, so the token invariants hold for any environment.
"""

from __future__ import annotations

from typing import Any

import pytest

from toolrollout.rollout import (
    EnvStep,
    RolloutConfig,
    RolloutRunner,
    Trajectory,
    TrajectoryHooks,
    TrajectoryState,
    TrajectoryStatus,
)
from toolrollout.rollout._types import ModelTurn
from toolrollout.testing import ScriptedEngine, ScriptedOutput
from toolrollout.tools import calculator_tool

PROMPT = [{"role": "user", "content": "Guess my number."}]


def ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def scripted(tokenizer: Any, *texts: str) -> ScriptedEngine:
    return ScriptedEngine(
        [ScriptedOutput(ids(tokenizer, t), logprobs=[-0.5 - i / 10] * len(ids(tokenizer, t)))
         for i, t in enumerate(texts)]
    )  # fmt: skip


class GuessingGame(TrajectoryHooks):
    """Answers each guess without tools; ends after ``rounds`` model turns."""

    def __init__(self, secret: str, rounds: int) -> None:
        self.secret = secret
        self.rounds = rounds

    def should_stop(self, state: TrajectoryState) -> str | None:
        return "rounds" if state.num_turns >= self.rounds else super().should_stop(state)

    async def on_model_turn(self, state: TrajectoryState, turn: ModelTurn) -> None:
        if self.secret in turn.text:
            state.finish(TrajectoryStatus.COMPLETED, "guessed")

    async def env_step(self, state: TrajectoryState, turn: ModelTurn, env: Any) -> EnvStep | None:
        return EnvStep("interaction", ({"role": "user", "content": "No, higher."},))

    async def score(
        self, state: TrajectoryState, trajectory: Trajectory
    ) -> tuple[float | None, dict[str, float]]:
        won = trajectory.finish_reason == "guessed"
        return (1.0 if won else 0.0), {"turns": float(trajectory.num_turns)}


async def test_an_environment_without_tools_answers_each_turn(demo_tokenizer: Any) -> None:
    engine = scripted(demo_tokenizer, "Is it 3?<|im_end|>", "Is it 5?<|im_end|>")
    runner = RolloutRunner(
        engine, demo_tokenizer, [calculator_tool()], hooks=GuessingGame("7", rounds=2)
    )
    [traj] = await runner.run([PROMPT])
    assert traj.status is TrajectoryStatus.TRUNCATED and traj.finish_reason == "rounds"
    # The environment answers every turn; should_stop ends it before a third model turn.
    assert [s.kind for s in traj.spans] == ["model", "interaction", "model", "interaction"]
    assert traj.reward == 0.0 and traj.reward_details == {"turns": 2.0}
    assert traj.metrics["reward_terms"] == {"turns": 2.0}
    first, second = (
        ids(demo_tokenizer, "Is it 3?<|im_end|>"),
        ids(demo_tokenizer, "Is it 5?<|im_end|>"),
    )
    # The environment's message is the template delta after the first turn, mask 0, lp 0.
    chat = runner.chat
    history = [*PROMPT, {"role": "assistant", "content": "Is it 3?"}]
    delta = chat.tool_turn_delta(history, [{"role": "user", "content": "No, higher."}])
    last = list(traj.spans[3].ids)
    assert traj.response_ids == first + delta + second + last
    assert traj.loss_mask == [1] * len(first) + [0] * len(delta) + [1] * len(second) + [0] * len(
        last
    )
    assert traj.rollout_logprobs == (
        [-0.5] * len(first) + [0.0] * len(delta) + [-0.6] * len(second) + [0.0] * len(last)
    )
    assert traj.messages[-1] == {"role": "user", "content": "No, higher."}
    assert traj.metrics["drift_mismatches"] == 0  # a fresh render gives the same ids
    # The second request was exactly prompt + everything appended so far.
    assert list(engine.requests[1].input_ids) == list(traj.prompt_ids) + first + delta


async def test_on_model_turn_can_end_the_trajectory(demo_tokenizer: Any) -> None:
    engine = scripted(demo_tokenizer, "Is it 3?<|im_end|>", "Is it 7?<|im_end|>", "unused")
    runner = RolloutRunner(engine, demo_tokenizer, [], hooks=GuessingGame("7", rounds=5))
    [traj] = await runner.run([PROMPT])
    assert traj.status is TrajectoryStatus.COMPLETED and traj.finish_reason == "guessed"
    assert traj.num_turns == 2 and traj.reward == 1.0
    assert len(engine.requests) == 2


async def test_the_budget_applies_to_a_custom_environment(demo_tokenizer: Any) -> None:
    engine = scripted(demo_tokenizer, "Is it 3?<|im_end|>")
    budget = len(ids(demo_tokenizer, "Is it 3?<|im_end|>")) + 3  # too small for the answer
    runner = RolloutRunner(
        engine,
        demo_tokenizer,
        [],
        config=RolloutConfig(max_response_tokens=budget),
        hooks=GuessingGame("7", rounds=5),
    )
    [traj] = await runner.run([PROMPT])
    assert traj.finish_reason == "max_response_tokens"
    assert [s.kind for s in traj.spans] == ["model"]  # nothing of the refused delta


class BrokenScore(TrajectoryHooks):
    async def score(
        self, state: TrajectoryState, trajectory: Trajectory
    ) -> tuple[float | None, dict[str, float]]:
        raise ValueError("no judge")


async def test_a_failing_score_hook_fails_the_row(demo_tokenizer: Any) -> None:
    engine = scripted(demo_tokenizer, "Hi.<|im_end|>")
    runner = RolloutRunner(engine, demo_tokenizer, [], hooks=BrokenScore())
    [traj] = await runner.run([PROMPT])
    assert traj.status is TrajectoryStatus.FAILED and traj.finish_reason == "reward_error"
    assert traj.error == "ValueError: no judge" and traj.reward is None


@pytest.mark.parametrize("hooks", [None, TrajectoryHooks()])
async def test_default_hooks_run_the_tools(demo_tokenizer: Any, hooks: Any) -> None:
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 3"}}\n</tool_call>'
    engine = scripted(demo_tokenizer, call + "<|im_end|>", "5<|im_end|>")
    runner = RolloutRunner(engine, demo_tokenizer, [calculator_tool()], hooks=hooks)
    [traj] = await runner.run([PROMPT])
    assert traj.status is TrajectoryStatus.COMPLETED and traj.num_tool_calls == 1
    assert [s.kind for s in traj.spans] == ["model", "tool", "model"]


async def test_an_overlong_prompt_is_a_local_budget_not_an_engine_error(
    demo_tokenizer: Any,
) -> None:
    engine = scripted(demo_tokenizer, "unused")
    runner = RolloutRunner(engine, demo_tokenizer, [], config=RolloutConfig(context_length=8))
    [traj] = await runner.run([PROMPT])
    assert traj.status is TrajectoryStatus.FAILED and traj.finish_reason == "overlong_prompt"
    assert traj.error is not None and traj.error.startswith("LocalContextBudget: prompt has")
    assert "the context is 8" in traj.error and "OverlongPromptError" not in traj.error
    assert engine.requests == []
