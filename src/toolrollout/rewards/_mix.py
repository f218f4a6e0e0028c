"""How the outcome reward, interaction turn rewards and tool rewards make one reward.

:class:`RewardMix` weighs the three sources; the rule, and why the defaults (1, 0, 0) keep
the reward equal to the reward functions' sum, are in docs/interactions.md. Absent terms
are left out; when no term with a non-zero weight is present the reward is None.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from toolrollout._exceptions import UserError

__all__ = ["RewardMix"]

Reduce = Literal["sum", "mean", "last", "max", "min"]
_REDUCERS: dict[str, Callable[[Sequence[float]], float]] = {
    "sum": math.fsum,
    "mean": lambda values: math.fsum(values) / len(values),
    "last": lambda values: values[-1],
    "max": max,
    "min": min,
}


@dataclass(frozen=True, slots=True)
class RewardMix:
    """Weights and reductions of the three reward sources."""

    outcome_weight: float = 1.0
    """Weight of the reward functions' (already weighted) sum."""
    turn_weight: float = 0.0
    """Weight of the interaction turn rewards, reduced by ``turn_reduce``."""
    tool_weight: float = 0.0
    """Weight of the tool rewards: per-call rewards reduced by ``tool_reduce``, plus the
    sum of the stateful tools' ``calc_reward`` values."""
    turn_reduce: Reduce = "sum"
    tool_reduce: Reduce = "sum"

    def __post_init__(self) -> None:
        for name in ("outcome_weight", "turn_weight", "tool_weight"):
            value = getattr(self, name)
            if not math.isfinite(value):
                raise UserError(f"{name} must be a finite number, got {value}")
        for name in ("turn_reduce", "tool_reduce"):
            if getattr(self, name) not in _REDUCERS:
                raise UserError(
                    f"{name} must be one of {', '.join(_REDUCERS)}, got {getattr(self, name)!r}"
                )

    def terms(
        self,
        turn_rewards: Sequence[float | None],
        tool_rewards: Sequence[float | None],
        tool_final_rewards: Mapping[str, float],
    ) -> dict[str, float]:
        """The reduced ``turn_rewards`` and ``tool_rewards`` terms that are present."""
        out: dict[str, float] = {}
        turns = [r for r in turn_rewards if r is not None]
        if turns:
            out["turn_rewards"] = _REDUCERS[self.turn_reduce](turns)
        steps = [r for r in tool_rewards if r is not None]
        if steps or tool_final_rewards:
            step = _REDUCERS[self.tool_reduce](steps) if steps else 0.0
            out["tool_rewards"] = step + math.fsum(tool_final_rewards.values())
        return out

    def combine(
        self,
        outcome: float | None,
        turn_rewards: Sequence[float | None],
        tool_rewards: Sequence[float | None],
        tool_final_rewards: Mapping[str, float],
    ) -> tuple[float | None, dict[str, float]]:
        """The reward and the reduced turn/tool terms (for ``reward_details``)."""
        terms = self.terms(turn_rewards, tool_rewards, tool_final_rewards)
        weighted = (
            (self.outcome_weight, outcome),
            (self.turn_weight, terms.get("turn_rewards")),
            (self.tool_weight, terms.get("tool_rewards")),
        )
        parts = [weight * value for weight, value in weighted if value is not None and weight != 0]
        return (math.fsum(parts) if parts else None), terms
