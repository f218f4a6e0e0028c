"""Per-sample extras, the same for every trainer.

Batch metrics are :func:`toolrollout.metrics.rollout_metrics`, the scheme ``toolrollout
eval`` logs too, so a dashboard built on one trainer reads the same on another.
"""

from __future__ import annotations

from typing import Any

from toolrollout._records import Trajectory
from toolrollout.rewards import final_answer_text

__all__ = ["trajectory_extras"]


def trajectory_extras(trajectory: Trajectory) -> dict[str, Any]:
    """What a trainer's reward functions may want besides the tokens, JSON-ready.

    ``reward`` is toolrollout's own reward (``None`` when no reward function ran or the
    trajectory failed), ``tool_stats`` the per-tool call summary of this trajectory,
    ``turn_rewards`` / ``tool_rewards`` one entry per model turn (interaction scores and
    summed per-call tool rewards, ``None`` where there was none).
    """
    stats = trajectory.metrics.get("tool_stats") or {}
    return {
        "reward": trajectory.reward,
        "num_turns": trajectory.num_turns,
        "num_tool_calls": trajectory.num_tool_calls,
        "tool_errors": trajectory.tool_errors,
        "parse_errors": trajectory.parse_errors,
        "status": str(trajectory.status),
        "finish_reason": trajectory.finish_reason,
        "final_answer": final_answer_text(trajectory),
        "tool_stats": {name: dict(summary) for name, summary in stats.items()},
        "turn_rewards": list(trajectory.turn_rewards),
        "tool_rewards": list(trajectory.tool_rewards),
        "weight_version": trajectory.weight_version,
    }
