"""Per-trajectory tool instances in the rollout loop: create once with the row's
``create_kwargs``, execute with its ``execute_kwargs``, ``calc_reward`` when scored, and
release exactly once on every way out (success, tool failure, engine failure, abort,
cancellation)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest

from toolrollout.engines import FinishReason, GenerateRequest
from toolrollout.exceptions import EngineConnectionError
from toolrollout.rewards import RewardMix
from toolrollout.rollout import RolloutConfig, RolloutRunner, TrajectoryStatus
from toolrollout.testing import ScriptedEngine, ScriptedOutput
from toolrollout.tools import StatefulTool, ToolResult

PROMPT = [{"role": "user", "content": "Guess my number."}]


def _parameters() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"value": {"type": "integer"}},
        "required": ["value"],
    }


@dataclass(frozen=True, kw_only=True)
class GuessTool(StatefulTool):
    """A per-sample grader: its reward is 1.0 once the guess equals ``create_kwargs.target``."""

    name: str = "guess"
    description: str = "Submit a guess."
    parameters: Mapping[str, Any] = field(default_factory=_parameters)
    log: list[tuple[str, str, Any]] = field(default_factory=list, compare=False)
    boxes: dict[str, dict[str, Any]] = field(default_factory=dict, compare=False)
    fail_execute: bool = False
    fail_create_for: Any = None

    async def create(self, instance_id: str, **create_kwargs: Any) -> str:
        self.log.append(("create", instance_id, create_kwargs))
        if create_kwargs.get("target") == self.fail_create_for is not None:
            raise RuntimeError("no room for this sample")
        self.boxes[instance_id] = {"target": create_kwargs.get("target"), "hit": False}
        return instance_id

    async def execute(
        self, instance_id: str, parameters: Mapping[str, Any], **execute_kwargs: Any
    ) -> ToolResult:
        self.log.append(("execute", instance_id, execute_kwargs))
        if self.fail_execute:
            raise RuntimeError("grader offline")
        box = self.boxes[instance_id]
        box["hit"] = parameters["value"] == box["target"]
        return ToolResult(text="hit" if box["hit"] else "miss", reward=0.1)

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float | None:
        self.log.append(("calc_reward", instance_id, kwargs))
        return 1.0 if self.boxes[instance_id]["hit"] else 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self.log.append(("release", instance_id, kwargs))
        self.boxes.pop(instance_id)

    def count(self, event: str) -> dict[str, int]:
        counts: dict[str, int] = {}
        for kind, instance_id, _ in self.log:
            if kind == event:
                counts[instance_id] = counts.get(instance_id, 0) + 1
        return counts


def row(target: int | None, **more: Any) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    if target is not None:
        extra["tools_kwargs"] = {
            "guess": {
                "create_kwargs": {"target": target},
                "execute_kwargs": {"attempt_limit": 3},
                "calc_reward_kwargs": {"strict": True},
                **more,
            }
        }
    return {"messages": PROMPT, "extra_info": extra}


def per_trajectory_script(tokenizer: Any, *steps: Any) -> ScriptedEngine:
    """Every trajectory gets the same steps, in order, whatever the interleaving."""
    seen: dict[str | None, int] = {}

    def answer(request: GenerateRequest) -> Any:
        turn = seen.get(request.session_id, 0)
        seen[request.session_id] = turn + 1
        step = steps[turn]
        if isinstance(step, Exception):
            raise step
        if isinstance(step, str):
            out = tokenizer.encode(step, add_special_tokens=False)
            return ScriptedOutput(out, logprobs=[-0.1] * len(out))
        return step(tokenizer)

    return ScriptedEngine(answer)


CALL = (
    '<tool_call>\n{"name": "guess", "arguments": '
    + json.dumps({"value": 3})
    + "}\n</tool_call><|im_end|>"
)
DONE = "I guessed.<|im_end|>"


async def test_instances_follow_the_lifecycle_and_rewards_depend_on_create_kwargs(
    demo_tokenizer: Any,
) -> None:
    tool = GuessTool()
    runner = RolloutRunner(
        per_trajectory_script(demo_tokenizer, CALL, DONE),
        demo_tokenizer,
        [tool],
        config=RolloutConfig(reward_mix=RewardMix(tool_weight=1.0)),
    )
    hit, miss = await runner.run([row(3), row(4)])
    assert hit.status is miss.status is TrajectoryStatus.COMPLETED
    # Same guess, different per-sample create_kwargs, different rewards.
    assert hit.tool_final_rewards == {"guess": 1.0}
    assert miss.tool_final_rewards == {"guess": 0.0}
    assert hit.tool_rewards == miss.tool_rewards == (0.1, None)
    assert hit.reward == pytest.approx(1.1) and miss.reward == pytest.approx(0.1)
    assert hit.reward_details == {"tool_rewards": pytest.approx(1.1)}
    for traj, target in ((hit, 3), (miss, 4)):
        events = [(kind, kwargs) for kind, iid, kwargs in tool.log if iid == traj.uid]
        assert events == [
            ("create", {"target": target}),
            ("execute", {"attempt_limit": 3}),
            ("calc_reward", {"strict": True}),
            ("release", {}),
        ]
    assert tool.boxes == {}


async def test_undeclared_tool_is_created_on_first_call(demo_tokenizer: Any) -> None:
    tool = GuessTool()
    runner = RolloutRunner(
        per_trajectory_script(demo_tokenizer, CALL, DONE), demo_tokenizer, [tool]
    )
    [traj] = await runner.run([row(None)])
    assert [(k, a) for k, _, a in tool.log] == [
        ("create", {}),
        ("execute", {}),
        ("calc_reward", {}),
        ("release", {}),
    ]
    assert traj.tool_final_rewards == {"guess": 0.0}
    assert traj.reward is None  # default mix: recorded, not in the reward


async def test_release_once_when_the_tool_fails(demo_tokenizer: Any) -> None:
    tool = GuessTool(fail_execute=True)
    runner = RolloutRunner(
        per_trajectory_script(demo_tokenizer, CALL, DONE), demo_tokenizer, [tool]
    )
    [traj] = await runner.run([row(3)])
    assert traj.status is TrajectoryStatus.COMPLETED and traj.tool_errors == 1
    assert "grader offline" in next(m["content"] for m in traj.messages if m["role"] == "tool")
    assert tool.count("create") == tool.count("release") == {traj.uid: 1}
    assert traj.tool_rewards == (None, None)


async def test_release_once_when_the_engine_fails(demo_tokenizer: Any) -> None:
    tool = GuessTool()
    engine = per_trajectory_script(demo_tokenizer, CALL, EngineConnectionError("reset by peer"))
    runner = RolloutRunner(engine, demo_tokenizer, [tool])
    [traj] = await runner.run([row(3)])
    assert traj.status is TrajectoryStatus.FAILED and "reset by peer" in (traj.error or "")
    assert tool.count("create") == tool.count("release") == {traj.uid: 1}
    assert tool.count("calc_reward") == {}  # a failed trajectory is not scored
    assert traj.tool_final_rewards == {}


async def test_release_once_on_abort(demo_tokenizer: Any) -> None:
    tool = GuessTool()

    def aborted(tokenizer: Any) -> ScriptedOutput:
        out = tokenizer.encode("I think", add_special_tokens=False)
        return ScriptedOutput(out, finish_reason=FinishReason(type="abort", message="Aborted"))

    runner = RolloutRunner(
        per_trajectory_script(demo_tokenizer, CALL, aborted), demo_tokenizer, [tool]
    )
    [traj] = await runner.run([row(3)])
    assert traj.status is TrajectoryStatus.ABORTED
    assert tool.count("create") == tool.count("release") == {traj.uid: 1}


async def test_release_once_on_cancellation(demo_tokenizer: Any) -> None:
    tool = GuessTool()

    def hangs(tokenizer: Any) -> ScriptedOutput:
        return ScriptedOutput(tokenizer.encode(DONE, add_special_tokens=False), delay=60)

    runner = RolloutRunner(
        per_trajectory_script(demo_tokenizer, CALL, hangs), demo_tokenizer, [tool]
    )
    with anyio.move_on_after(1.0) as scope:
        await runner.run([row(3), row(4)])
    assert scope.cancelled_caught
    released = tool.count("release")
    assert len(released) == 2 and set(released.values()) == {1}
    assert tool.count("create") == released and tool.boxes == {}


async def test_failed_create_fails_only_that_trajectory(demo_tokenizer: Any) -> None:
    tool = GuessTool(fail_create_for=4)
    runner = RolloutRunner(
        per_trajectory_script(demo_tokenizer, CALL, DONE), demo_tokenizer, [tool]
    )
    ok, bad = await runner.run([row(3), row(4)])
    assert ok.status is TrajectoryStatus.COMPLETED
    assert bad.status is TrajectoryStatus.FAILED
    assert "create failed" in (bad.error or "") and "no room" in (bad.error or "")
    # Nothing was created for the failed one, so nothing is released; the other is released once.
    assert tool.count("release") == {ok.uid: 1}
