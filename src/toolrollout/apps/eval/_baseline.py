"""The single-turn baseline: the same model and prompts with tools switched off.

It answers "do tools help at all?": no tool schemas in the prompt and one assistant turn,
with the same sampling, budgets and rewards as the tool run, so the two differ only in the
tools.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from toolrollout.engines._base import Engine
from toolrollout.rewards import WeightedReward
from toolrollout.rollout import RolloutConfig, RolloutRunner, Trajectory
from toolrollout.spec import RunSpec, build_runner

__all__ = ["single_turn_config", "single_turn_runner"]


def single_turn_config(config: RolloutConfig) -> RolloutConfig:
    """``config`` limited to one assistant turn and no tool calls."""
    return replace(config, max_turns=1, max_tool_calls=0)


def single_turn_runner(
    engine: Engine,
    tokenizer: Any,
    *,
    config: RolloutConfig,
    rewards: Sequence[Callable[[Trajectory], Any] | WeightedReward] = (),
) -> RolloutRunner:
    """A runner for the baseline arm: no tools registered, so none is rendered or run."""
    spec = RunSpec(
        tools=(), config=single_turn_config(config), rewards=tuple(rewards), vision="off"
    )
    return build_runner(spec, engine, tokenizer=tokenizer)
