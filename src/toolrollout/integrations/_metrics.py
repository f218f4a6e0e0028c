"""Per-sample extras, the same for every trainer.

Batch metrics are :func:`toolrollout.metrics.rollout_metrics`, the scheme ``toolrollout
eval`` logs too, so a dashboard built on one trainer reads the same on another.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from toolrollout._records import Trajectory
from toolrollout.rewards._base import final_answer_text

if TYPE_CHECKING:
    from toolrollout.chat import ChatFormat
    from toolrollout.chat.parsers import ToolCallParser

__all__ = ["CUT_FINISH_REASON", "cut_extras", "trajectory_extras"]

CUT_FINISH_REASON = "max_completion_length"
"""``finish_reason`` of a completion the trainer cut to its completion limit."""


def trajectory_extras(trajectory: Trajectory) -> dict[str, Any]:
    """What a trainer's reward functions may want besides the tokens, JSON-ready.

    ``turn_rewards`` / ``tool_rewards`` have one entry per model turn (``None`` where none).
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
        "weight_versions": turn_weight_versions(trajectory),
    }


def turn_weight_versions(trajectory: Trajectory, kept: int | None = None) -> list[str | None]:
    """The weight version of each engine answer, in order (within the first ``kept`` tokens).

    One per generation request: a turn resumed after an abort has two.
    """
    return [v for start, _, v in trajectory.weight_segments if kept is None or start < kept]


def cut_extras(
    trajectory: Trajectory, kept: int, chat: ChatFormat, parser: ToolCallParser
) -> dict[str, Any]:
    """:func:`trajectory_extras` of only the first ``kept`` response tokens.

    For a completion the trainer cut: counts cover the kept turns only, and ``reward`` is
    None (it scored text the trainer does not train on); ``tool_stats``, ``tool_errors``
    and ``parse_errors`` still describe every call that ran.
    """
    extras = trajectory_extras(trajectory)
    assistant = [m for m in trajectory.messages if m.get("role") == "assistant"]
    models = [span for span in trajectory.spans if span.kind == "model"]
    by_turn = len(assistant) == len(models)  # one message per model turn (else re-parse)
    position, turns, calls, answer = 0, 0, 0, ""
    for span in trajectory.spans:
        if position >= kept:
            break
        room = kept - position
        position += len(span.ids)
        if span.kind != "model":
            continue
        if len(span.ids) <= room and by_turn:
            message = assistant[turns]
            content = message.get("content")
            answer = content if isinstance(content, str) else ""
            calls += len(message.get("tool_calls") or ())
        else:
            text = chat.model_text(span.ids[:room])
            parsed = parser.parse(text)
            answer = text if parsed.errors else parsed.content
            calls += 0 if parsed.errors else len(parsed.tool_calls)
        turns += 1
    extras.update(
        reward=None,
        status="truncated",
        finish_reason=CUT_FINISH_REASON,
        final_answer=answer,
        num_turns=turns,
        num_tool_calls=calls,
        turn_rewards=list(trajectory.turn_rewards[:turns]),
        tool_rewards=list(trajectory.tool_rewards[:turns]),
        weight_versions=turn_weight_versions(trajectory, kept),
    )
    versions = extras["weight_versions"]
    extras["weight_version"] = versions[-1] if versions else trajectory.weight_version
    return extras
