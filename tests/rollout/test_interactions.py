"""Interaction turns in the rollout loop, against a scripted engine and the real template.

The engine is the documented test seam (``ScriptedEngine``); the tokenizer, chat template,
grader interaction and reward rule are the real ones.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from toolrollout.exceptions import InteractionError, UserError
from toolrollout.interactions import GraderInteraction, Interaction, InteractionReply
from toolrollout.rewards import RewardMix, numeric_match
from toolrollout.rollout import (
    RolloutConfig,
    RolloutRunner,
    Trajectory,
    TrajectoryStatus,
    read_rows,
    write_trajectories,
)
from toolrollout.testing import ScriptedEngine, ScriptedOutput
from toolrollout.tools import calculator_tool
from toolrollout.tools.calculator import CALCULATOR_TOOL

PROMPT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is 2 + 3?"},
]


def ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def scripted(tokenizer: Any, *texts: str) -> ScriptedEngine:
    return ScriptedEngine(
        [
            ScriptedOutput(ids(tokenizer, t), logprobs=[-0.25] * len(ids(tokenizer, t)))
            for t in texts
        ]
    )


def row(name: str = "grader", answer: str = "5", **extra: Any) -> dict[str, Any]:
    return {
        "messages": PROMPT,
        "answer": answer,
        "extra_info": {"interaction_kwargs": {"name": name, **extra}},
    }


def assert_token_exact(traj: Trajectory, tokenizer: Any) -> None:
    """The transcript decodes to the template's render of the final messages."""
    assert len(traj.response_ids) == len(traj.loss_mask) == len(traj.rollout_logprobs)
    for span in traj.spans:
        if span.kind != "model":
            assert set(span.loss_mask) == {0} and set(span.logprobs) == {0.0}
    decoded = tokenizer.decode(list(traj.prompt_ids) + traj.response_ids)
    rendered = tokenizer.apply_chat_template(
        list(traj.messages), tools=[CALCULATOR_TOOL], tokenize=False
    )
    assert rendered == decoded + "\n"  # qwen25 boundary rule, as for tool turns
    assert traj.metrics["drift_mismatches"] == 0


async def test_retry_then_accept(demo_tokenizer: Any) -> None:
    engine = scripted(demo_tokenizer, "The answer is 4.<|im_end|>", "The answer is 5.<|im_end|>")
    runner = RolloutRunner(
        engine,
        demo_tokenizer,
        [calculator_tool()],
        config=RolloutConfig(reward_mix=RewardMix(turn_weight=0.5)),
        rewards=[numeric_match],
        interactions={"grader": GraderInteraction({"retry_message": "Wrong, try again."})},
    )
    [traj] = await runner.run([row()])
    assert traj.status is TrajectoryStatus.COMPLETED, traj.error
    assert traj.finish_reason == "stop"
    assert [s.kind for s in traj.spans] == ["model", "interaction", "model"]
    assert traj.num_turns == 2
    # The retry request is a user turn; the closing "Correct." is not appended.
    assert [m["role"] for m in traj.messages] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    assert traj.messages[3]["content"] == "Wrong, try again."
    assert_token_exact(traj, demo_tokenizer)
    # The second request continued the exact transcript: prompt + model ids + delta.
    first, delta = traj.spans[0].ids, traj.spans[1].ids
    assert tuple(engine.requests[1].input_ids) == traj.prompt_ids + first + delta
    # Per-turn rewards line up with model turns; the reward follows the documented rule.
    assert traj.turn_rewards == (0.0, 1.0)
    assert traj.tool_rewards == (None, None)
    assert traj.reward == pytest.approx(1.0 + 0.5 * 1.0)
    assert traj.reward_details == {"numeric_match": 1.0, "turn_rewards": 1.0}
    assert traj.metrics["interaction_turns"] == 2
    assert traj.metrics["interaction_tokens"] == len(delta)


async def test_grader_gives_up_after_k_retries(demo_tokenizer: Any) -> None:
    engine = scripted(demo_tokenizer, *["It is 7.<|im_end|>"] * 3)
    runner = RolloutRunner(
        engine,
        demo_tokenizer,
        [calculator_tool()],
        config=RolloutConfig(max_turns=8),
        rewards=(),
        interactions={"grader": GraderInteraction({"max_retries": 1})},
    )
    [traj] = await runner.run([row()])
    assert traj.status is TrajectoryStatus.COMPLETED
    assert traj.num_turns == 2 and len(engine.requests) == 2
    assert traj.turn_rewards == (0.0, 0.0)
    # Default mix: turn rewards are recorded but not in the reward (no reward functions).
    assert traj.reward is None and traj.reward_details == {"turn_rewards": 0.0}


async def test_budgets_apply_to_interaction_turns(demo_tokenizer: Any) -> None:
    grader = {"grader": GraderInteraction({"max_retries": 5})}
    engine = scripted(demo_tokenizer, "It is 7.<|im_end|>")
    runner = RolloutRunner(
        engine, demo_tokenizer, [], config=RolloutConfig(max_turns=1), interactions=grader
    )
    [traj] = await runner.run([row()])
    assert (traj.status, traj.finish_reason) == (TrajectoryStatus.TRUNCATED, "max_turns")
    assert [s.kind for s in traj.spans] == ["model"] and traj.turn_rewards == (0.0,)

    engine = scripted(demo_tokenizer, *["It is 7.<|im_end|>"] * 3)
    runner = RolloutRunner(
        engine,
        demo_tokenizer,
        [],
        config=RolloutConfig(max_interaction_turns=1),
        interactions=grader,
    )
    [traj] = await runner.run([row()])
    assert (traj.status, traj.finish_reason) == (
        TrajectoryStatus.TRUNCATED,
        "max_interaction_turns",
    )
    assert [s.kind for s in traj.spans] == ["model", "interaction", "model"]

    out = ids(demo_tokenizer, "It is 7.<|im_end|>")
    engine = scripted(demo_tokenizer, "It is 7.<|im_end|>")
    runner = RolloutRunner(
        engine,
        demo_tokenizer,
        [],
        config=RolloutConfig(max_response_tokens=len(out) + 3),
        interactions=grader,
    )
    [traj] = await runner.run([row()])
    assert (traj.status, traj.finish_reason) == (TrajectoryStatus.TRUNCATED, "max_response_tokens")
    assert len(traj.response_ids) == len(out)


class RecordingInteraction(Interaction):
    """verl-style: returns tuples, records the calls it gets."""

    def __init__(self, config: dict[str, Any] | None = None, *, fail: bool = False) -> None:
        super().__init__(config)
        self.fail = fail
        self.events: list[tuple[str, str, dict[str, Any]]] = []

    async def start_interaction(self, instance_id: str | None = None, **kwargs: Any) -> str:
        assert instance_id is not None
        self.events.append(("start", instance_id, kwargs))
        return instance_id

    async def generate_response(
        self, instance_id: str, messages: Any, **kwargs: Any
    ) -> tuple[bool, str, float | None, dict[str, Any]]:
        self.events.append(("respond", instance_id, {"last": messages[-1]["content"]}))
        if self.fail:
            raise RuntimeError("simulator crashed")
        done = len([e for e in self.events if e[0] == "respond"]) >= 2
        return done, "Say it again.", None if done else 0.25, {}

    async def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        self.events.append(("finalize", instance_id, {}))


async def test_interaction_gets_row_kwargs_and_is_finalized(demo_tokenizer: Any) -> None:
    sim = RecordingInteraction()
    engine = scripted(demo_tokenizer, "Five.<|im_end|>", "Five!<|im_end|>")
    runner = RolloutRunner(engine, demo_tokenizer, [], interactions={"sim": sim})
    [traj] = await runner.run([row("sim", query="q1")])
    assert traj.status is TrajectoryStatus.COMPLETED
    kinds = [e[0] for e in sim.events]
    assert kinds == ["start", "respond", "respond", "finalize"]
    assert {e[1] for e in sim.events} == {traj.uid}
    # verl passes the row's interaction_kwargs to start and respond; the row's answer fills
    # in a missing ground_truth.
    assert sim.events[0][2] == {"name": "sim", "query": "q1", "ground_truth": "5"}
    assert sim.events[2][2] == {"last": "Five!"}
    assert traj.turn_rewards == (0.25, None)


async def test_failing_interaction_fails_the_trajectory_and_is_finalized(
    demo_tokenizer: Any,
) -> None:
    sim = RecordingInteraction(fail=True)
    runner = RolloutRunner(
        scripted(demo_tokenizer, *["Five.<|im_end|>"] * 2),
        demo_tokenizer,
        [],
        rewards=(),  # one row has a ground truth, the other none: no match term for either
        interactions={"s": sim},
    )
    [traj, other] = await runner.run([row("s"), {"messages": PROMPT}])
    assert traj.status is TrajectoryStatus.FAILED
    assert traj.error is not None and traj.error.startswith("InteractionError:")
    assert "simulator crashed" in traj.error
    assert [e[0] for e in sim.events] == ["start", "respond", "finalize"]
    # A row without interaction_kwargs runs without one (the run goes on).
    assert other.status is TrajectoryStatus.COMPLETED and other.turn_rewards == (None,)


class HangingInteraction(Interaction):
    async def generate_response(self, instance_id: str, messages: Any, **kwargs: Any) -> Any:
        await anyio.sleep(30)


async def test_hanging_interaction_times_out(demo_tokenizer: Any) -> None:
    runner = RolloutRunner(
        scripted(demo_tokenizer, "Five.<|im_end|>"),
        demo_tokenizer,
        [],
        config=RolloutConfig(interaction_timeout=0.2),
        interactions={"h": HangingInteraction()},
    )
    with anyio.fail_after(10):
        [traj] = await runner.run([row("h")])
    assert traj.status is TrajectoryStatus.FAILED
    assert "generate_response took longer than 0.2 s" in (traj.error or "")


async def test_unknown_interaction_name_is_a_user_error(demo_tokenizer: Any) -> None:
    runner = RolloutRunner(
        ScriptedEngine([]), demo_tokenizer, [], interactions={"grader": GraderInteraction()}
    )
    with pytest.raises(
        UserError, match=r"prompt 0: interaction_kwargs\.name 'nope' is not configured"
    ):
        await runner.run([row("nope")])


def test_reply_coercion() -> None:
    assert InteractionReply.coerce((True, "ok", 1, {"a": 1})) == InteractionReply(
        True, "ok", 1.0, {"a": 1}
    )
    with pytest.raises(InteractionError, match="tuple"):
        InteractionReply.coerce("done")
    with pytest.raises(InteractionError, match="number"):
        InteractionReply.coerce((False, "x", "high", {}))


async def test_reward_columns_roundtrip(demo_tokenizer: Any, tmp_path: Any) -> None:
    engine = scripted(demo_tokenizer, "The answer is 4.<|im_end|>", "The answer is 5.<|im_end|>")
    runner = RolloutRunner(engine, demo_tokenizer, [], interactions={"grader": GraderInteraction()})
    trajectories = await runner.run([row()])
    for suffix in ("parquet", "jsonl"):
        [back] = read_rows(write_trajectories(trajectories, tmp_path / f"t.{suffix}"))
        assert back["turn_rewards"] == [0.0, 1.0]
        assert back["tool_rewards"] == [None, None]
        assert back["tool_final_rewards"] == {}
        assert back["loss_mask"] == trajectories[0].loss_mask
