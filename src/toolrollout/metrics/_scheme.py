"""The metric naming scheme and the batch metrics of a set of trajectories.

Names are ``section/quantity[/statistic]``, e.g. ``rollout/num_turns/mean``: one scheme for
``toolrollout eval``, the trackers and the trainer adapters (docs/eval.md has the rules
that keep names valid in every tracker).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolrollout._records import Trajectory

__all__ = [
    "TERMINAL_STATUSES",
    "SampleStats",
    "ToolUse",
    "metric_key",
    "rollout_metrics",
    "sample_stats",
]

TERMINAL_STATUSES = ("completed", "truncated", "aborted", "failed")
"""Every batch reports the fraction of each, zeros included, so series never vanish."""

_RESERVED_TOOL_NAMES = frozenset({"calls", "failure_rate", "parse_error_rate", "used_fraction"})
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\- ]+")


def metric_key(*parts: str) -> str:
    """Join name parts with ``/``; characters trackers reject (MLflow allows only
    alphanumerics, ``_ - . space`` and ``/``) become ``_`` inside each part."""
    cleaned = []
    for part in parts:
        safe = _UNSAFE.sub("_", str(part)).strip() or "_"
        cleaned.append(safe)
    return "/".join(cleaned)


@dataclass(frozen=True, slots=True)
class ToolUse:
    """One tool's calls within one trajectory."""

    calls: int
    errors: int
    seconds: float
    timeouts: int = 0
    """Calls that timed out (counted in ``errors`` too)."""


@dataclass(frozen=True, slots=True)
class SampleStats:
    """What the metrics read from one trajectory; built from a Trajectory or an output row."""

    prompt_index: int
    sample_index: int
    status: str
    reward: float | None
    num_turns: int
    num_tool_calls: int
    tool_errors: int
    parse_errors: int
    response_tokens: int
    model_tokens: int
    generation_seconds: float
    tool_seconds: float
    total_seconds: float | None
    data_source: str | None = None
    tools: Mapping[str, ToolUse] = field(default_factory=dict)
    finish_reason: str | None = None
    """Why it ended; for a failed row, the cause (``tool_unavailable``, ``error``...)."""


def _tools_from_metrics(metrics: Mapping[str, Any]) -> dict[str, ToolUse]:
    stats = metrics.get("tool_stats") or {}
    return {
        str(name): ToolUse(
            calls=int(entry.get("calls", 0)),
            errors=int(entry.get("errors", 0)),
            seconds=float(entry.get("seconds", 0.0)),
            timeouts=int(entry.get("timeouts", 0)),
        )
        for name, entry in stats.items()
    }


_COUNTS = (
    "prompt_index",
    "sample_index",
    "num_turns",
    "num_tool_calls",
    "tool_errors",
    "parse_errors",
)
"""The integer fields of a SampleStats, named alike in a row and on a Trajectory."""


def sample_stats(item: Trajectory | Mapping[str, Any] | SampleStats) -> SampleStats:
    """Read one trajectory, or one row of a toolrollout parquet/JSONL file (as returned by
    :func:`toolrollout.rollout.read_rows`, or raw with ``metrics`` still a JSON string)."""
    if isinstance(item, SampleStats):
        return item
    own: dict[str, Any]
    if isinstance(item, Mapping):
        metrics = item.get("metrics") or {}
        if isinstance(metrics, str):
            metrics = json.loads(metrics)
        reward = item.get("reward")
        own = {k: int(item[k]) for k in _COUNTS}
        own.update(
            status=str(item["status"]),
            reward=None if reward is None else float(reward),
            response_tokens=len(item.get("response_ids") or ()),
            data_source=item.get("data_source"),
            finish_reason=item.get("finish_reason"),
        )
    else:
        metrics = item.metrics
        own = {k: getattr(item, k) for k in (*_COUNTS, "reward", "data_source")}
        own.update(
            status=str(item.status),
            response_tokens=sum(len(span.ids) for span in item.spans),
            finish_reason=item.finish_reason,
        )
    total = metrics.get("total_seconds")
    return SampleStats(
        **own,
        model_tokens=int(metrics.get("model_tokens", 0)),
        generation_seconds=float(metrics.get("generation_seconds", 0.0)),
        tool_seconds=float(metrics.get("tool_seconds", 0.0)),
        total_seconds=None if total is None else float(total),
        tools=_tools_from_metrics(metrics),
    )


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _std(values: list[float]) -> float:
    if not values:
        return math.nan
    mean = _mean(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else 0.0


def rollout_metrics(
    items: Iterable[Trajectory | Mapping[str, Any] | SampleStats],
) -> dict[str, float]:
    """Batch metrics of trajectories under the shared naming scheme (see docs/eval.md).

    The one batch-metrics function: ``toolrollout eval``, the trackers and the trainer
    adapters all log these names. Means are per trajectory. Rates whose denominator is zero
    (no tool calls) are 0.0; a statistic with no values at all (no scored trajectory) is NaN
    rather than a fake 0.
    """
    samples = [sample_stats(item) for item in items]
    count = len(samples)
    out: dict[str, float] = {"rollout/trajectories": float(count)}
    rewards = [s.reward for s in samples if s.reward is not None]
    out["rollout/reward/mean"] = _mean(rewards)
    out["rollout/reward/std"] = _std(rewards)
    out["rollout/reward/min"] = min(rewards) if rewards else math.nan
    out["rollout/reward/max"] = max(rewards) if rewards else math.nan
    for status in TERMINAL_STATUSES:
        out[metric_key("rollout", "status", status)] = _ratio(
            sum(s.status == status for s in samples), count
        )
    # Failed because a tool was unavailable: an infrastructure failure, not the model's.
    unavailable = sum(
        s.status == "failed" and s.finish_reason == "tool_unavailable" for s in samples
    )
    out["rollout/failure/tool_unavailable"] = _ratio(unavailable, count)
    turns = [float(s.num_turns) for s in samples]
    out["rollout/num_turns/mean"] = _mean(turns)
    out["rollout/num_turns/min"] = min(turns) if turns else math.nan
    out["rollout/num_turns/max"] = max(turns) if turns else math.nan
    response = [float(s.response_tokens) for s in samples]
    out["rollout/response_tokens/mean"] = _mean(response)
    out["rollout/response_tokens/max"] = max(response) if response else math.nan
    model = [float(s.model_tokens) for s in samples]
    out["rollout/model_tokens/mean"] = _mean(model)

    calls = sum(s.num_tool_calls for s in samples)
    executed = sum(use.calls for s in samples for use in s.tools.values())
    failed = sum(use.errors for s in samples for use in s.tools.values())
    malformed = sum(s.parse_errors for s in samples)
    out["tools/calls/mean"] = _ratio(calls, count)
    out["tools/calls/sum"] = float(calls)
    out["tools/used_fraction"] = _ratio(sum(s.num_tool_calls > 0 for s in samples), count)
    out["tools/failure_rate"] = _ratio(failed, executed)
    out["tools/parse_error_rate"] = _ratio(malformed, calls + malformed)
    names = sorted({name for s in samples for name in s.tools})
    for name in names:
        uses = [s.tools[name] for s in samples if name in s.tools]
        n_calls = sum(u.calls for u in uses)
        # A tool named like an aggregate would turn that aggregate's leaf into a folder.
        segment = f"tool_{name}" if name in _RESERVED_TOOL_NAMES else name
        out[metric_key("tools", segment, "calls")] = float(n_calls)
        out[metric_key("tools", segment, "calls_per_trajectory")] = _ratio(n_calls, count)
        out[metric_key("tools", segment, "failure_rate")] = _ratio(
            sum(u.errors for u in uses), n_calls
        )
        out[metric_key("tools", segment, "timeout_rate")] = _ratio(
            sum(u.timeouts for u in uses), n_calls
        )
        out[metric_key("tools", segment, "latency_s", "mean")] = _ratio(
            sum(u.seconds for u in uses), n_calls
        )

    generation = [s.generation_seconds for s in samples]
    tools_s = [s.tool_seconds for s in samples]
    out["timing/generation_s/mean"] = _mean(generation)
    out["timing/generation_s/sum"] = sum(generation)
    out["timing/tools_s/mean"] = _mean(tools_s)
    out["timing/tools_s/sum"] = sum(tools_s)
    totals = [s.total_seconds for s in samples if s.total_seconds is not None]
    out["timing/total_s/mean"] = _mean(totals)
    out["timing/tools_share"] = _ratio(sum(tools_s), sum(generation) + sum(tools_s))
    return out
