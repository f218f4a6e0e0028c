"""Per-sample extras and batch metrics, named the same way for every trainer.

Trainers log flat ``name -> float`` dicts. The names follow one scheme,
``<area>/<quantity>/<statistic>``, shared with ``toolrollout eval``: ``rollout/...`` for
trajectory-level numbers and ``tools/<tool name>/...`` for each tool, so a dashboard built on
one trainer reads the same on another.
"""

from __future__ import annotations

from collections.abc import Sequence
from statistics import fmean
from typing import Any

from toolrollout.rewards import final_answer_text
from toolrollout.rollout import Trajectory, TrajectoryStatus

__all__ = ["rollout_metrics", "trajectory_extras"]


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


def _stats(prefix: str, values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {}
    return {
        f"{prefix}/mean": float(fmean(values)),
        f"{prefix}/min": float(min(values)),
        f"{prefix}/max": float(max(values)),
    }


def rollout_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Batch metrics of ``trajectories`` under the shared naming scheme.

    ``rollout/num_turns/mean|min|max``, ``rollout/num_tool_calls/...``,
    ``rollout/response_tokens/...``, ``rollout/model_tokens/...``, ``rollout/reward/...``
    (rows with a reward only), ``rollout/<status>/fraction`` for every terminal status, and
    per tool ``tools/<name>/calls``, ``tools/<name>/failure_rate`` (errors / calls),
    ``tools/<name>/timeout_rate`` and ``tools/<name>/latency/mean`` (seconds per call).
    """
    if not trajectories:
        return {}
    count = len(trajectories)
    out: dict[str, float] = {}
    out.update(_stats("rollout/num_turns", [t.num_turns for t in trajectories]))
    out.update(_stats("rollout/num_tool_calls", [t.num_tool_calls for t in trajectories]))
    out.update(_stats("rollout/response_tokens", [len(t.response_ids) for t in trajectories]))
    out.update(_stats("rollout/model_tokens", [sum(t.loss_mask) for t in trajectories]))
    out.update(_stats("rollout/reward", [t.reward for t in trajectories if t.reward is not None]))
    for status in (
        TrajectoryStatus.COMPLETED,
        TrajectoryStatus.TRUNCATED,
        TrajectoryStatus.ABORTED,
        TrajectoryStatus.FAILED,
    ):
        out[f"rollout/{status}/fraction"] = sum(t.status is status for t in trajectories) / count
    totals: dict[str, dict[str, float]] = {}
    for trajectory in trajectories:
        for name, summary in (trajectory.metrics.get("tool_stats") or {}).items():
            acc = totals.setdefault(name, {"calls": 0.0, "errors": 0.0, "timeouts": 0.0, "s": 0.0})
            acc["calls"] += summary.get("calls", 0)
            acc["errors"] += summary.get("errors", 0)
            acc["timeouts"] += summary.get("timeouts", 0)
            acc["s"] += summary.get("seconds", 0.0)
    for name, acc in sorted(totals.items()):
        calls = acc["calls"]
        out[f"tools/{name}/calls"] = calls
        if calls:
            out[f"tools/{name}/failure_rate"] = acc["errors"] / calls
            out[f"tools/{name}/timeout_rate"] = acc["timeouts"] / calls
            out[f"tools/{name}/latency/mean"] = acc["s"] / calls
    return out
