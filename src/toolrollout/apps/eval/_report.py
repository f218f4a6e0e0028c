"""The evaluation report: four PNG figures and a Markdown page that embeds them.

matplotlib is drawn through its object API (``Figure`` + the Agg canvas), not ``pyplot``,
so nothing global is touched and a trainer's process can write a report.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from toolrollout._exceptions import UserError

from ._summary import Comparison, EvalSummary

__all__ = ["FIGURES", "HEADLINE", "pass_at_keys", "write_report"]

FIGURES = ("accuracy.png", "turns.png", "tool_calls.png", "latency.png")
"""File names of the figures, written next to ``report.md``."""

HEADLINE = (
    ("eval/accuracy", "accuracy"),
    ("rollout/reward/mean", "mean reward"),
    ("rollout/num_turns/mean", "turns / trajectory"),
    ("tools/calls/mean", "tool calls / trajectory"),
    ("tools/failure_rate", "tool failure rate"),
    ("tools/parse_error_rate", "parse error rate"),
    ("rollout/response_tokens/mean", "response tokens"),
    ("timing/generation_s/mean", "generation s / trajectory"),
    ("timing/tools_s/mean", "tool s / trajectory"),
    ("rollout/status/failed", "failed fraction"),
    ("rollout/failure/tool_unavailable", "failed: tool unavailable (not scored)"),
)
"""The report's main table, (metric, title) in order; pass@k rows follow it."""


def pass_at_keys(runs: Sequence[EvalSummary]) -> list[str]:
    """The ``eval/pass_at_<k>`` metrics of ``runs``, by k."""
    keys = {k for r in runs for k in r.metrics if k.startswith("eval/pass_at_")}
    return sorted(keys, key=lambda k: int(k.rsplit("_", 1)[1]))


def _figure(width: float = 6.0, height: float = 3.6) -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise UserError(
            "plots need matplotlib: pip install 'toolrollout[eval]' (or matplotlib)"
        ) from exc
    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def _accuracy_plot(runs: Sequence[EvalSummary], ax: Any) -> None:
    labels = [r.label for r in runs]
    values = [r.metrics["eval/accuracy"] for r in runs]
    low = [max(r.metrics["eval/accuracy"] - r.metrics["eval/accuracy_ci_low"], 0.0) for r in runs]
    high = [max(r.metrics["eval/accuracy_ci_high"] - r.metrics["eval/accuracy"], 0.0) for r in runs]
    bars = ax.bar(labels, values, yerr=[low, high], capsize=6, color=["C0", "C1", "C2", "C3"])
    ax.bar_label(bars, labels=[f"{v:.2f}" for v in values], padding=3)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("accuracy (95% bootstrap CI)")
    ax.set_title("Accuracy")


def _grouped_bars(
    ax: Any,
    runs: Sequence[EvalSummary],
    xs: Sequence[int],
    heights: Callable[[EvalSummary], list[float]],
) -> None:
    """One bar per run at each x, side by side; ``heights(run)``: the run's bars."""
    width = 0.8 / len(runs)
    for i, run in enumerate(runs):
        shift = (i - (len(runs) - 1) / 2) * width
        ax.bar([x + shift for x in xs], heights(run), width, label=run.label)
    ax.legend()


def _turns_plot(runs: Sequence[EvalSummary], ax: Any) -> None:
    turns = sorted({t for r in runs for t in r.turns_histogram})
    _grouped_bars(
        ax,
        runs,
        turns,
        lambda r: [r.turns_histogram.get(t, 0) / sum(r.turns_histogram.values()) for t in turns],
    )
    ax.set_xticks(turns)
    ax.set_xlabel("assistant turns")
    ax.set_ylabel("fraction of trajectories")
    ax.set_title("Turns per trajectory")


def _tool_calls_plot(runs: Sequence[EvalSummary], ax: Any) -> None:
    names = sorted({n for r in runs for n in r.tool_calls})
    if not names:
        ax.text(0.5, 0.5, "no tool calls", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
    else:
        xs = range(len(names))
        _grouped_bars(ax, runs, xs, lambda r: [r.tool_calls.get(n, 0.0) for n in names])
        ax.set_xticks(xs, names)
        ax.set_ylabel("calls per trajectory")
    ax.set_title("Tool calls per tool")


def _latency_plot(runs: Sequence[EvalSummary], ax: Any) -> None:
    labels = [r.label for r in runs]
    bottom = [0.0] * len(runs)
    for part in ("generation", "tools", "other"):
        values = [r.latency.get(part, 0.0) for r in runs]
        ax.bar(labels, values, bottom=bottom, label=part)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_ylabel("seconds per trajectory (mean)")
    ax.set_title("Latency: generation vs tools")
    ax.legend()


def _fmt(value: float | None, *, count: bool = False) -> str:
    if value is None or math.isnan(value):
        return "-"
    return str(int(value)) if count else f"{value:.3f}"


def _table(runs: Sequence[EvalSummary], names: Sequence[tuple[str, str]]) -> list[str]:
    lines = ["| metric | " + " | ".join(r.label for r in runs) + " |"]
    lines.append("|---|" + "---:|" * len(runs))
    for key, title in names:
        cells = [_fmt(r.metrics.get(key)) for r in runs]
        lines.append(f"| {title} (`{key}`) | " + " | ".join(cells) + " |")
    return lines


def write_report(
    out_dir: str | Path,
    runs: Sequence[EvalSummary],
    *,
    comparison: Comparison | None = None,
    title: str = "toolrollout eval",
) -> Path:
    """Write the figures, ``report.md`` and ``metrics.json`` into ``out_dir``; return the
    report's path. ``runs`` are shown side by side in the given order."""
    if not runs:
        raise UserError("a report needs at least one run")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plots = (_accuracy_plot, _turns_plot, _tool_calls_plot, _latency_plot)
    for name, plot in zip(FIGURES, plots, strict=True):
        fig = _figure()
        plot(runs, fig.add_subplot())
        fig.savefig(out / name)

    lines = [f"# {title}", ""]
    if comparison is not None:
        diff = comparison.accuracy_difference
        kind = "paired over problems" if diff.paired else "unpaired"
        lines += [
            f"Accuracy of **{comparison.after.label}** minus **{comparison.before.label}**: "
            f"**{diff.estimate:+.3f}** ({diff.confidence:.0%} bootstrap CI "
            f"[{diff.low:+.3f}, {diff.high:+.3f}], {diff.resamples} resamples, {kind}).",
            "",
        ]
    passes = [(key, f"pass@{key.rsplit('_', 1)[1]}") for key in pass_at_keys(runs)]
    lines += _table(runs, [*HEADLINE, *passes])
    lines += [
        "",
        "![accuracy](accuracy.png) ![turns](turns.png)",
        "",
        "![tool calls](tool_calls.png) ![latency](latency.png)",
        "",
    ]
    lines += _by_source(runs)
    lines += [
        "Metric names follow the scheme in docs/eval.md; every value is in `metrics.json`.",
        "",
    ]
    report = out / "report.md"
    report.write_text("\n".join(lines), encoding="utf-8")
    (out / "metrics.json").write_text(
        json.dumps(_metrics_json(runs, comparison), indent=2, default=str, allow_nan=True),
        encoding="utf-8",
    )
    return report


def _by_source(runs: Sequence[EvalSummary]) -> list[str]:
    """A table per run of its metrics by data source (runs with one source have none)."""
    lines: list[str] = []
    for run in runs:
        if not run.by_source:
            continue
        lines += [f"## {run.label}: by data source", ""]
        lines.append("| data_source | trajectories | accuracy | turns | tool calls |")
        lines.append("|---|---:|---:|---:|---:|")
        for source, m in run.by_source.items():
            lines.append(
                f"| {source} | {_fmt(m['rollout/trajectories'], count=True)} "
                f"| {_fmt(m['eval/accuracy'])} | {_fmt(m['rollout/num_turns/mean'])} "
                f"| {_fmt(m['tools/calls/mean'])} |"
            )
        lines.append("")
    return lines


def _metrics_json(runs: Sequence[EvalSummary], comparison: Comparison | None) -> dict[str, Any]:
    """What ``metrics.json`` holds: each run's numbers, and the comparison if there is one."""
    payload: dict[str, Any] = {
        "runs": {
            r.label: {
                "metrics": r.flat_metrics(),
                "turns_histogram": {str(k): v for k, v in r.turns_histogram.items()},
                "tool_calls": dict(r.tool_calls),
                "latency": dict(r.latency),
                "config": dict(r.config),
            }
            for r in runs
        },
    }
    if comparison is not None:
        payload["compare"] = {
            "before": comparison.before.label,
            "after": comparison.after.label,
            **comparison.metrics(),
        }
    return payload
