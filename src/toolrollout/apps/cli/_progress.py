"""What a rollout command shows: a live progress bar (rich), fed one finished trajectory
at a time, and the summary table at the end."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

__all__ = ["RolloutProgress", "finish", "print_summary", "summarise"]


class RolloutProgress:
    """Shows done/failed counts, tool calls and generated tokens per second."""

    def __init__(self, total: int, *, completed: int = 0) -> None:
        self._progress = Progress(
            TextColumn("[bold]rollouts"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
            transient=False,
        )
        self._task = self._progress.add_task("rollouts", total=total, completed=completed, stats="")
        self._failed = 0
        self._tool_calls = 0
        self._tokens = 0
        self._started = time.perf_counter()

    def __enter__(self) -> Self:
        self._progress.start()
        return self

    def update(self, trajectory: Any) -> None:
        self._failed += int(str(trajectory.status) == "failed")
        self._tool_calls += trajectory.num_tool_calls
        self._tokens += int(trajectory.metrics.get("model_tokens", 0))
        rate = self._tokens / max(time.perf_counter() - self._started, 1e-9)
        stats = f"failed {self._failed} | tool calls {self._tool_calls} | {rate:.0f} tok/s"
        self._progress.update(self._task, advance=1, stats=stats)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._progress.stop()


def finish(summary: dict[str, Any], out: Path) -> None:
    """Print the summary and exit as the run ended (130/143 after a signal)."""
    interrupted = summary["interrupted"]
    if interrupted is not None and summary.get("batch_run"):
        typer.echo(
            f"interrupted by {interrupted}: a --target-groups or --resume-leftover "
            "run writes its batch and leftover only at the end, so nothing was written",
            err=True,
        )
        raise typer.Exit(code=143 if interrupted == "SIGTERM" else 130)
    for failure in summary.get("ray_failures", ()):
        typer.echo(f"warning: {failure}", err=True)
    print_summary(summary, out, err=interrupted is not None)
    if interrupted is not None:
        typer.echo(
            f"interrupted by {interrupted}: {summary['rows_on_disk']} of "
            f"{summary['total']} rows kept in {summary['parts']}; "
            "rerun with --resume to complete the run",
            err=True,
        )
        raise typer.Exit(code=143 if interrupted == "SIGTERM" else 130)


def summarise(trajectories: list[Any], elapsed: float) -> dict[str, Any]:
    from toolrollout.rollout import TrajectoryStatus

    rewards = [t.reward for t in trajectories if t.reward is not None]
    count = max(len(trajectories), 1)
    return {
        "trajectories": len(trajectories),
        "seconds": elapsed,
        "mean_reward": sum(rewards) / len(rewards) if rewards else None,
        "mean_turns": sum(t.num_turns for t in trajectories) / count,
        "tool_calls": sum(t.num_tool_calls for t in trajectories),
        "tool_errors": sum(t.tool_errors for t in trajectories),
        "parse_errors": sum(t.parse_errors for t in trajectories),
        "drift": sum(int(t.metrics.get("drift_mismatches", 0)) for t in trajectories),
        "statuses": dict(Counter(str(t.status) for t in trajectories)),
        "failures": dict(
            Counter(
                t.finish_reason or "unknown"
                for t in trajectories
                if t.status is TrajectoryStatus.FAILED
            )
        ),
        "model_tokens": sum(int(t.metrics.get("model_tokens", 0)) for t in trajectories),
        "engine_moves": sum(len(t.metrics.get("engine_moves", ())) for t in trajectories),
    }


def print_summary(summary: dict[str, Any], out: Path, *, err: bool = False) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"toolrollout generate -> {out}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    mean_reward = summary["mean_reward"]
    rows = [
        ("trajectories", str(summary["trajectories"])),
        *(
            (f"failed: {cause}" + (" (not scored)" if cause == "tool_unavailable" else ""), str(n))
            for cause, n in sorted(summary.get("failures", {}).items())
        ),
        ("mean reward", "-" if mean_reward is None else f"{mean_reward:.3f}"),
        ("mean turns", f"{summary['mean_turns']:.2f}"),
        ("tool calls", str(summary["tool_calls"])),
        ("tool errors", str(summary["tool_errors"])),
        ("parse errors", str(summary["parse_errors"])),
        ("drift mismatches", str(summary["drift"])),
        ("generated tokens/s", f"{summary['model_tokens'] / max(summary['seconds'], 1e-9):.1f}"),
        ("wall seconds", f"{summary['seconds']:.1f}"),
    ]
    if summary.get("engine_moves"):
        rows.append(("moved to another server (failover)", str(summary["engine_moves"])))
    if summary.get("gc_frozen_objects") is not None:
        rows.append(("objects frozen (--gc-freeze)", f"{summary['gc_frozen_objects']:,}"))
    if summary.get("gc_threshold") is not None:
        thresholds = ", ".join(f"{n:,}" for n in summary["gc_threshold"])
        rows.append(("collector thresholds (--gc-threshold)", thresholds))
    if summary.get("resumed"):
        rows.append(("rows kept from before", str(summary["resumed"])))
    if summary.get("left_over") is not None:
        rows.append(
            (
                "left over (straggler control)",
                f"{summary['left_over']} -> {summary['leftover_path']}",
            )
        )
    rows += [(f"status {k}", str(v)) for k, v in sorted(summary["statuses"].items())]
    rows += [
        (f"ray shard {s['shard']}", f"{s['rows']} rows on {s['host']} ({s['seconds']:.1f} s)")
        for s in summary.get("ray_shards", ())
    ]
    for name, value in rows:
        table.add_row(name, value)
    Console(stderr=err).print(table)
