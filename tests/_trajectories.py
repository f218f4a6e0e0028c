"""Hand-built trajectories for metric and evaluation tests (no engine involved)."""

from __future__ import annotations

from typing import Any

from toolrollout.rollout import TokenSpan, Trajectory, TrajectoryStatus


def make(
    index: int,
    *,
    status: TrajectoryStatus = TrajectoryStatus.COMPLETED,
    reward: float | None = 1.0,
    turns: int = 2,
    tool_stats: dict[str, tuple[int, int, float]] | None = None,
    parse_errors: int = 0,
    model_tokens: int = 5,
    tool_tokens: int = 3,
    generation: float = 1.0,
    tools_s: float = 0.5,
    total: float = 2.0,
    source: str | None = None,
) -> Trajectory:
    stats = tool_stats or {}
    calls = sum(c for c, _, _ in stats.values())
    errors = sum(e for _, e, _ in stats.values())
    spans = (
        TokenSpan("model", tuple(range(model_tokens)), (-0.1,) * model_tokens),
        TokenSpan("tool", tuple(range(tool_tokens)), (0.0,) * tool_tokens),
    )
    metrics: dict[str, Any] = {
        "generation_seconds": generation,
        "tool_seconds": tools_s,
        "total_seconds": total,
        "model_tokens": model_tokens,
        "tool_tokens": tool_tokens,
    }
    if stats:
        metrics["tool_stats"] = {
            name: {"calls": c, "errors": e, "seconds": s} for name, (c, e, s) in stats.items()
        }
    return Trajectory(
        uid=f"g{index}-0",
        group_id=f"g{index}",
        prompt_index=index,
        sample_index=0,
        prompt_ids=(1, 2, 3),
        spans=spans,
        messages=({"role": "user", "content": "q"},),
        status=status,
        finish_reason="stop",
        reward=reward,
        num_turns=turns,
        num_tool_calls=calls,
        tool_errors=errors,
        parse_errors=parse_errors,
        metrics=metrics,
        data_source=source,
    )
