"""Shared metric names and per-sample extras; the adapters' import stays trainer-free."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from toolrollout import RolloutConfig, RolloutRunner, SamplingParams
from toolrollout.integrations import trajectory_extras
from toolrollout.metrics import rollout_metrics
from toolrollout.testing import ScriptedEngine
from toolrollout.tools import calculator_tool


def test_importing_the_adapters_imports_no_trainer() -> None:
    code = (
        "import sys, toolrollout.integrations as i; "
        "print(*[m in sys.modules for m in ('torch', 'transformers', 'trl', 'verl', 'swift')])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False"] * 5


def test_metrics_and_extras_follow_the_naming_scheme(
    scripted_engine: ScriptedEngine, demo_tokenizer: Any
) -> None:
    runner = RolloutRunner(
        scripted_engine,
        demo_tokenizer,
        [calculator_tool()],
        config=RolloutConfig(sampling=SamplingParams(max_new_tokens=64), n=3),
        rewards=[lambda t: 1.0 if "1364" in t.messages[-1]["content"] else 0.0],
    )
    trajectories = runner.run_sync([[{"role": "user", "content": "Multiply 4 by 341."}]])
    metrics = rollout_metrics(trajectories)
    assert metrics["rollout/num_turns/mean"] == 2.0
    assert metrics["tools/calls/mean"] == 1.0 and metrics["tools/used_fraction"] == 1.0
    assert metrics["rollout/reward/mean"] == 1.0
    assert metrics["rollout/status/completed"] == 1.0
    assert metrics["rollout/status/failed"] == 0.0
    assert metrics["tools/calculator/calls"] == 3.0
    assert metrics["tools/calculator/failure_rate"] == 0.0
    model_tokens = sum(sum(t.loss_mask) for t in trajectories) / 3
    assert metrics["rollout/model_tokens/mean"] == model_tokens
    assert metrics["rollout/response_tokens/mean"] > model_tokens
    extras = trajectory_extras(trajectories[0])
    assert extras["reward"] == 1.0 and extras["status"] == "completed"
    assert extras["tool_stats"]["calculator"]["calls"] == 1
    assert rollout_metrics([])["rollout/trajectories"] == 0.0


def test_failure_rate_counts_tool_errors(demo_tokenizer: Any) -> None:
    from tests.integrations._scripted import calculator_script

    runner = RolloutRunner(
        ScriptedEngine(calculator_script(demo_tokenizer, expression="1 / 0")),
        demo_tokenizer,
        [calculator_tool()],
        config=RolloutConfig(sampling=SamplingParams(max_new_tokens=64), n=2),
    )
    metrics = rollout_metrics(runner.run_sync([[{"role": "user", "content": "1/0?"}]]))
    assert metrics["tools/calculator/calls"] == 2.0
    assert metrics["tools/calculator/failure_rate"] == 1.0
