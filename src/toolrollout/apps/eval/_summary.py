"""Evaluation summaries: accuracy, pass@k and the rollout metrics of one run, and the
difference between two runs.

Everything is computed from trajectories or output rows alone, so a run evaluated live and
the same run re-read from its parquet file give the same numbers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from toolrollout._exceptions import UserError
from toolrollout.metrics import rollout_metrics
from toolrollout.metrics._scheme import SampleStats, metric_key, sample_stats

from ._stats import Interval, bootstrap_difference, bootstrap_mean, pass_at_k

if TYPE_CHECKING:
    from toolrollout._records import Trajectory

__all__ = ["Comparison", "EvalSummary", "compare", "default_ks", "summarize"]


def default_ks(n: int) -> list[int]:
    """1, then powers of two below ``n``, then ``n`` itself: the usual pass@k columns."""
    ks = [1]
    k = 2
    while k < n:
        ks.append(k)
        k *= 2
    if n > 1:
        ks.append(n)
    return ks


@dataclass(frozen=True, slots=True)
class EvalSummary:
    """The evaluation of one run (one arm: with tools, single-turn, a checkpoint...)."""

    label: str
    metrics: Mapping[str, float]
    """``rollout_metrics`` plus ``eval/...`` (accuracy, its interval, pass@k)."""
    by_source: Mapping[str, Mapping[str, float]]
    """The same metrics per ``data_source``, when the run mixes several sources."""
    problem_scores: Mapping[int, float]
    """Fraction of correct samples per problem (``prompt_index``): what the CIs resample."""
    turns_histogram: Mapping[int, int]
    """Number of trajectories per number of assistant turns."""
    tool_calls: Mapping[str, float]
    """Calls per trajectory, per tool name."""
    latency: Mapping[str, float]
    """Mean seconds per trajectory in ``generation``, ``tools`` and ``other`` (queueing,
    template rendering, reward scoring)."""
    success_threshold: float = 0.5
    config: Mapping[str, Any] = field(default_factory=dict)
    """What produced the run (sampling, budgets, model), for the report and the trackers."""

    def flat_metrics(self, prefix: str = "") -> dict[str, float]:
        """All metrics with per-source ones under ``by_source/<source>/``, then ``prefix``."""
        out = dict(self.metrics)
        for source, metrics in self.by_source.items():
            for name, value in metrics.items():
                out[f"{metric_key('by_source', source)}/{name}"] = value
        if prefix:
            out = {f"{metric_key(prefix)}/{k}": v for k, v in out.items()}
        return out


def _accuracy_metrics(
    samples: Sequence[SampleStats],
    threshold: float,
    ks: Sequence[int] | None,
    seed: int,
) -> tuple[dict[str, float], dict[int, float]]:
    correct: dict[int, int] = Counter()
    total: dict[int, int] = Counter()
    for s in samples:
        total[s.prompt_index] += 1
        if s.reward is not None and s.reward >= threshold:
            correct[s.prompt_index] += 1
    scores = {p: correct[p] / total[p] for p in total}
    interval = bootstrap_mean([scores[p] for p in sorted(scores)], seed=seed)
    out = {
        "eval/problems": float(len(total)),
        "eval/samples_per_problem": float(min(total.values())),
        "eval/accuracy": sum(correct.values()) / len(samples),
        "eval/accuracy_ci_low": interval.low,
        "eval/accuracy_ci_high": interval.high,
    }
    n_min = min(total.values())
    for k in ks if ks is not None else default_ks(n_min):
        if k > n_min:
            continue
        values = [pass_at_k(total[p], correct[p], k) for p in sorted(total)]
        out[f"eval/pass_at_{k}"] = sum(values) / len(values)
    return out, scores


def summarize(
    items: Iterable[Trajectory | Mapping[str, Any] | SampleStats],
    *,
    label: str = "run",
    success_threshold: float = 0.5,
    ks: Sequence[int] | None = None,
    seed: int = 0,
    config: Mapping[str, Any] | None = None,
) -> EvalSummary:
    """Evaluate one run from its trajectories (or output rows).

    A sample is correct when its reward is at least ``success_threshold``; a sample without
    a reward (failed) counts as wrong, never as skipped. ``ks`` defaults to
    :func:`default_ks` of the smallest number of samples per problem.
    """
    samples = [sample_stats(item) for item in items]
    if not samples:
        raise UserError(f"run {label!r} has no trajectories to evaluate")
    metrics = rollout_metrics(samples)
    accuracy, scores = _accuracy_metrics(samples, success_threshold, ks, seed)
    metrics.update(accuracy)
    sources = sorted({s.data_source for s in samples if s.data_source is not None})
    by_source: dict[str, dict[str, float]] = {}
    if len(sources) > 1:
        for source in sources:
            subset = [s for s in samples if s.data_source == source]
            source_metrics = rollout_metrics(subset)
            source_metrics.update(_accuracy_metrics(subset, success_threshold, ks, seed)[0])
            by_source[source] = source_metrics
    calls: Counter[str] = Counter()
    for s in samples:
        for name, use in s.tools.items():
            calls[name] += use.calls
    count = len(samples)
    generation = sum(s.generation_seconds for s in samples) / count
    tools = sum(s.tool_seconds for s in samples) / count
    totals = [s.total_seconds for s in samples if s.total_seconds is not None]
    other = max(sum(totals) / len(totals) - generation - tools, 0.0) if totals else 0.0
    return EvalSummary(
        label=label,
        metrics=metrics,
        by_source=by_source,
        problem_scores=scores,
        turns_histogram=dict(sorted(Counter(s.num_turns for s in samples).items())),
        tool_calls={name: calls[name] / count for name in sorted(calls)},
        latency={"generation": generation, "tools": tools, "other": other},
        success_threshold=success_threshold,
        config=dict(config or {}),
    )


@dataclass(frozen=True, slots=True)
class Comparison:
    """Two runs side by side: ``after`` minus ``before`` on accuracy, with its interval."""

    before: EvalSummary
    after: EvalSummary
    accuracy_difference: Interval

    def metrics(self) -> dict[str, float]:
        diff = self.accuracy_difference
        return {
            "compare/accuracy/diff": diff.estimate,
            "compare/accuracy/ci_low": diff.low,
            "compare/accuracy/ci_high": diff.high,
            "compare/accuracy/paired": float(diff.paired),
        }


def compare(
    before: EvalSummary,
    after: EvalSummary,
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> Comparison:
    """Bootstrap the accuracy difference ``after - before`` over problems (paired when
    both runs scored the same problems)."""
    interval = bootstrap_difference(
        after.problem_scores,
        before.problem_scores,
        confidence=confidence,
        resamples=resamples,
        seed=seed,
    )
    return Comparison(before, after, interval)
