"""A tool whose service is down fails the trajectory; it is never scored as the model's 0.

The NeMo-RL #3470 failure: the sandbox dies, every later call returns "unavailable" to the
model, the model answers anyway, and the row is scored 0 as if the model were wrong. Here
the sandbox tool points at a port nothing listens on (a real connection refusal through
the real client, after its retries).
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from tests._processes import free_port

from toolrollout.rewards import exact_match
from toolrollout.rollout import RolloutConfig, RolloutRunner, TrajectoryStatus
from toolrollout.sandbox import sandbox_tool
from toolrollout.testing import ScriptedEngine, ScriptedOutput
from toolrollout.tools import RetryPolicy, ToolLimits

CALL = (
    '<tool_call>\n{"name": "python", "arguments": {"code": "print(2 + 3)"}}\n</tool_call><|im_end|>'
)
PROMPT = {"messages": [{"role": "user", "content": "Print 2 + 3."}], "answer": "5"}


def _run(tokenizer: Any, policy: str) -> Any:
    def out(text: str) -> ScriptedOutput:
        ids = tokenizer.encode(text, add_special_tokens=False)
        return ScriptedOutput(ids, [-0.5] * len(ids))

    # The client's own HTTP retries back off about 4 s before it says "unavailable"; a 5 s
    # call timeout ran out first on a loaded CI machine (2026-12), a timeout being another
    # error kind: the limit must leave room for the retries.
    limits = ToolLimits(timeout=60.0, retry=RetryPolicy(max_attempts=2, initial_backoff=0.01))
    tool = sandbox_tool(f"http://127.0.0.1:{free_port()}", limits=limits)
    engine = ScriptedEngine([out(CALL), out("5<|im_end|>")])
    config = RolloutConfig(tool_unavailable=policy)  # type: ignore[arg-type]
    runner = RolloutRunner(engine, tokenizer, [tool], config=config, rewards=[exact_match])
    [trajectory] = anyio.run(runner.run, [PROMPT])
    return trajectory


def test_an_unavailable_tool_fails_the_trajectory_unscored(demo_tokenizer: Any) -> None:
    trajectory = _run(demo_tokenizer, "fail")
    assert trajectory.status is TrajectoryStatus.FAILED
    assert trajectory.finish_reason == "tool_unavailable"
    assert trajectory.reward is None  # not a 0 the trainer would read as the model's
    assert "tool 'python' unavailable (ToolUnavailable)" in (trajectory.error or "")
    assert trajectory.num_turns == 1  # the model never read the error
    assert [m["role"] for m in trajectory.messages][-1] == "assistant"
    assert trajectory.metrics["tool_stats"]["python"]["calls"] == 1


def test_show_policy_lets_the_model_read_the_fault(demo_tokenizer: Any) -> None:
    trajectory = _run(demo_tokenizer, "show")
    assert trajectory.status is TrajectoryStatus.COMPLETED
    assert trajectory.num_turns == 2 and trajectory.tool_errors == 1
    [tool_message] = [m for m in trajectory.messages if m["role"] == "tool"]
    assert "unavailable" in tool_message["content"]
    assert trajectory.reward == 1.0


def test_the_policy_is_checked() -> None:
    from toolrollout.exceptions import UserError

    with pytest.raises(UserError, match="tool_unavailable must be 'fail' or 'show'"):
        RolloutConfig(tool_unavailable="retry")  # type: ignore[arg-type]


def test_trainer_adapter_trains_nothing_of_a_failed_row(demo_tokenizer: Any) -> None:
    from collections import defaultdict
    from types import SimpleNamespace

    from toolrollout.integrations import trl_rollout_func
    from toolrollout.spec import RunSpec

    ids = demo_tokenizer.encode(CALL, add_special_tokens=False)
    limits = ToolLimits(timeout=5.0, retry=RetryPolicy(max_attempts=1))
    tool = sandbox_tool(f"http://127.0.0.1:{free_port()}", limits=limits)
    engine = ScriptedEngine([ScriptedOutput(ids, [-0.5] * len(ids))])
    trainer = SimpleNamespace(
        args=SimpleNamespace(max_completion_length=None),
        model=SimpleNamespace(training=True),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
    )
    with trl_rollout_func(engine, demo_tokenizer, RunSpec(tools=[tool])) as rollout:
        out = rollout([PROMPT["messages"]], trainer)
    assert out["completion_ids"][0] == ids  # the model's turn is there...
    assert set(out["env_mask"][0]) == {0}  # ...but not one token of it is trained
    assert out["status"] == ["failed"]
    assert trainer._metrics["train"]["rollout/failure/tool_unavailable"] == [1.0]
