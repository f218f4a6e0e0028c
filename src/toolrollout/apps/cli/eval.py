"""``toolrollout eval``: evaluate a model on held-out prompts, with and without tools.

With no options it evaluates the bundled demo model on the demo prompts with the real
calculator tool, greedily, and writes trajectories, ``report.md`` and its figures into
``eval/``. ``--baseline single-turn`` adds the same prompts with tools off; ``--compare A B``
evaluates two existing trajectory files instead of running anything. User mistakes exit with
a one-line message and code 2.
"""

from __future__ import annotations

import math
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from toolrollout.apps.cli._common import fail, require_extra
from toolrollout.apps.cli._options import RUN, command, opt, pick, spec_from, user_message

if TYPE_CHECKING:
    from toolrollout.apps.eval._summary import Comparison, EvalSummary

__all__ = ["OPTIONS", "Baseline", "ReportTo", "eval_command", "register"]


class Baseline(StrEnum):
    """Which baseline arm to run beside the tool run."""

    NONE = "none"
    SINGLE_TURN = "single-turn"


class ReportTo(StrEnum):
    """Experiment tracker to log the run to."""

    NONE = "none"
    MLFLOW = "mlflow"
    WANDB = "wandb"


_SAMPLED = "With --sampled."
# fmt: off
OPTIONS = [
    *pick(RUN, "engine_url", "engine", "engine_api_key", "model"),
    RUN["dataset"].but(help="Held-out prompts (.jsonl or .parquet; verl RL layout accepted)."),
    RUN["tool_config"],
    RUN["n"].but(type=int, default=1, help="Samples per prompt; pass@k for k up to n."),
    opt("greedy", bool | None, None, "Greedy decoding, or sampling at --temperature. Default: "
        "greedy when --n is 1, sampled otherwise.", "--greedy/--sampled"),
    RUN["temperature"].but(help=_SAMPLED),
    RUN["top_p"].but(help=_SAMPLED),
    opt("baseline", Baseline, Baseline.NONE, "single-turn: also run the prompts with no tools "
        "and one turn."),
    opt("report_to", ReportTo, ReportTo.NONE, "Experiment tracker."),
    opt("tracking_uri", str | None, None, "MLflow tracking URI or directory (default: "
        "<out-dir>/mlruns), or the W&B run directory (default: <out-dir>)."),
    opt("experiment", str, "toolrollout-eval", "MLflow experiment / W&B project name."),
    opt("run_name", str | None, None, "Name of the tracked run."),
    opt("compare", tuple[Path, Path] | None, None, "Compare two trajectory files (before, "
        "after) instead of running a model."),
    opt("out_dir", Path, Path("eval"), "Where trajectories, report.md and figures go."),
    opt("success_threshold", float, 0.5, "A sample is correct when its reward is at least "
        "this."),
    *pick(RUN, "max_turns", "max_new_tokens", "max_response_tokens", "concurrency"),
    RUN["seed"].but(type=int, default=0, help="Sampling and bootstrap seed."),
    *pick(RUN, "limit", "tool_parser", "family", "chat_template_kwargs", "health_timeout",
          "threads", "request_timeout", "retries", "retry_budget", "failover_after"),
]
"""The options of ``eval``: the run options of :data:`~._options.RUN` and its own."""
# fmt: on


def eval_command(flags: Any) -> None:
    """Evaluate: accuracy, pass@k, tool use, turns, latency; report with plots; tracking."""
    require_extra("eval", "toolrollout eval")
    from toolrollout._exceptions import ToolRolloutError
    from toolrollout.apps.eval._report import FIGURES, write_report

    out_dir: Path = flags.out_dir
    comparison: Comparison | None
    try:
        if flags.compare is not None:
            if flags.baseline is not Baseline.NONE:
                raise fail("--compare evaluates two existing files; it runs no --baseline")
            runs, comparison, config, artifacts = _compare_files(flags)
        else:
            config = _config(flags)
            runs, comparison, artifacts = _run_model(flags, config)
        report = write_report(out_dir, runs, comparison=comparison)
        _print_table(runs, comparison)
        typer.echo(f"report: {report}")
        artifacts += [report, *(report.parent / f for f in FIGURES), out_dir / "metrics.json"]
        if flags.report_to is not ReportTo.NONE:
            tracked = _track(flags, runs, comparison, config=config, artifacts=artifacts)
            typer.echo(f"{tracked.backend} run {tracked.run_id} at {tracked.location}")
    except ToolRolloutError as exc:
        raise fail(user_message(exc, OPTIONS)) from None
    except OSError as exc:
        raise fail(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")) from None


def _config(flags: Any) -> dict[str, Any]:
    """What the run is, as the report and the tracker record it."""
    from toolrollout.apps.cli._common import parse_template_kwargs

    greedy = flags.n == 1 if flags.greedy is None else flags.greedy
    if greedy and flags.n > 1:
        raise fail("--greedy with --n > 1 repeats one answer; use --sampled for pass@k")
    return {
        "model": str(flags.model) if flags.model else "demo",
        "dataset": str(flags.dataset) if flags.dataset else "demo",
        "tool_config": str(flags.tool_config) if flags.tool_config else "calculator",
        "engine": ",".join(flags.engine_url) if flags.engine_url else "embedded",
        "n": flags.n,
        "decoding": "greedy" if greedy else "sampled",
        "temperature": 0.0 if greedy else flags.temperature,
        "top_p": 1.0 if greedy else flags.top_p,
        "max_turns": flags.max_turns,
        "max_new_tokens": flags.max_new_tokens,
        "max_response_tokens": flags.max_response_tokens,
        "seed": flags.seed,
        "limit": flags.limit,
        "tool_parser": flags.tool_parser,
        "family": flags.family,
        "chat_template_kwargs": parse_template_kwargs(flags.chat_template_kwargs),
        "baseline": str(flags.baseline),
        "success_threshold": flags.success_threshold,
    }


def _compare_files(flags: Any) -> tuple[list[EvalSummary], Comparison, dict[str, Any], list[Path]]:
    from toolrollout._exceptions import UserError
    from toolrollout.apps.eval import compare, summarize
    from toolrollout.rollout import read_rows

    paths: tuple[Path, Path] = flags.compare
    success_threshold, seed = flags.success_threshold, flags.seed
    before, after = paths
    labels = [before.stem, after.stem]
    if labels[0] == labels[1]:
        labels = [f"{before.parent.name}/{before.stem}", f"{after.parent.name}/{after.stem}"]
    if labels[0] == labels[1]:
        labels = ["before", "after"]
    runs = []
    for path, label in zip(paths, labels, strict=True):
        if not path.is_file():
            raise UserError(f"trajectory file not found: {path}")
        try:
            rows = read_rows(path)
        except Exception as exc:  # pyarrow/json raise many types for a wrong file
            raise UserError(f"{path}: not a toolrollout trajectory file ({exc})") from exc
        try:
            runs.append(
                summarize(rows, label=label, success_threshold=success_threshold, seed=seed)
            )
        except KeyError as exc:
            raise UserError(f"{path}: not a toolrollout trajectory file (no {exc})") from exc
    comparison = compare(runs[0], runs[1], seed=seed)
    config = {"before": str(before), "after": str(after), "success_threshold": success_threshold}
    return runs, comparison, config, [before, after]


def _run_model(
    flags: Any, config: dict[str, Any]
) -> tuple[list[EvalSummary], Comparison | None, list[Path]]:
    import anyio

    from toolrollout._exceptions import UserError
    from toolrollout.apps.demo import demo_prompts_for_tools
    from toolrollout.apps.eval import compare, summarize
    from toolrollout.data import load_prompts
    from toolrollout.spec import load_components

    sampling = {"temperature": config["temperature"], "top_p": config["top_p"]}
    spec = spec_from(flags, OPTIONS, {f"config.sampling.{k}": v for k, v in sampling.items()})
    components = load_components(spec)
    # Without --dataset, the demo prompt set that suits the tools (as `generate` picks it).
    prompts = load_prompts(
        flags.dataset or demo_prompts_for_tools(components.tool_names), limit=flags.limit
    )
    truths = [p.ground_truth for p in prompts if p.ground_truth is not None]
    if not truths:
        raise UserError("eval needs a ground truth per prompt ('answer' or 'ground_truth')")
    spec = spec.replace(rewards=spec.rewards_for(truths))
    out_dir: Path = flags.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    arms = [("tools", out_dir / "trajectories.parquet")]
    if flags.baseline == Baseline.SINGLE_TURN:
        arms.insert(0, ("single-turn", out_dir / "single_turn.parquet"))
    results = anyio.run(_run_arms, spec, components, prompts, arms)
    threshold, seed = float(config["success_threshold"]), int(config["seed"])
    runs = [
        summarize(
            results[label], label=label, success_threshold=threshold, seed=seed, config=config
        )
        for label, _ in arms
    ]
    comparison = compare(runs[0], runs[1], seed=seed) if len(runs) == 2 else None
    return runs, comparison, [path for _, path in arms]


async def _run_arms(
    spec: Any, components: Any, prompts: list[Any], arms: list[tuple[str, Path]]
) -> dict[str, list[Any]]:
    """Each arm's trajectories, written to its file; one arm after the other, so the latency
    of one is not inflated by the other."""
    from toolrollout.apps.eval._baseline import single_turn_runner
    from toolrollout.rollout import Trajectory, TrajectoryWriter
    from toolrollout.spec import open_run

    from ._progress import RolloutProgress

    results: dict[str, list[Any]] = {}
    async with open_run(spec, components=components) as run:
        for label, path in arms:
            runner = run.runner
            if label != "tools":
                runner = single_turn_runner(
                    run.engine, run.tokenizer, config=spec.config, rewards=spec.rewards
                )
            total = len(prompts) * spec.config.n
            with TrajectoryWriter(path) as writer, RolloutProgress(total) as progress:

                def on_result(trajectory: Trajectory) -> None:
                    writer.write(trajectory)
                    progress.update(trajectory)

                results[label] = await runner.run(prompts, on_result=on_result)
    return results


def _track(
    flags: Any,
    runs: list[EvalSummary],
    comparison: Comparison | None,
    *,
    config: dict[str, Any],
    artifacts: list[Path],
) -> Any:
    from toolrollout.apps.eval import log_to_mlflow, log_to_wandb

    metrics: dict[str, float] = {}
    if flags.compare is not None:
        metrics.update(runs[0].flat_metrics(prefix="before"))
        metrics.update(runs[1].flat_metrics(prefix="after"))
    else:
        for run in runs:
            # The tool run's metrics keep their plain names; other arms get a prefix.
            metrics.update(run.flat_metrics(prefix="" if run.label == "tools" else "baseline"))
    if comparison is not None:
        metrics.update(comparison.metrics())
    common: dict[str, Any] = {"config": config, "artifacts": artifacts, "run_name": flags.run_name}
    if flags.report_to is ReportTo.MLFLOW:
        where = flags.tracking_uri or flags.out_dir / "mlruns"
        return log_to_mlflow(metrics, tracking_uri=where, experiment=flags.experiment, **common)
    where = flags.tracking_uri or flags.out_dir
    return log_to_wandb(metrics, directory=where, project=flags.experiment, **common)


def _cell(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:.3f}"


def _print_table(runs: list[EvalSummary], comparison: Comparison | None) -> None:
    from rich.console import Console
    from rich.table import Table

    from toolrollout.apps.eval._report import HEADLINE, pass_at_keys

    table = Table(title="toolrollout eval")
    table.add_column("metric")
    for run in runs:
        table.add_column(run.label, justify="right")
    if comparison is not None:
        table.add_column("difference", justify="right")
    # The report's headline metrics, pass@k after accuracy, without the tool_unavailable row.
    headline = [key for key, _ in HEADLINE[:-1]]
    names = [headline[0], *pass_at_keys(runs[-1:]), *headline[1:]]
    for name in names:
        values = [run.metrics.get(name) for run in runs]
        row = [name, *(_cell(v) for v in values)]
        if comparison is not None:
            a, b = values[0], values[1]
            row.append("-" if a is None or b is None else _cell(b - a))
        table.add_row(*row)
    Console().print(table)
    if comparison is not None:
        diff = comparison.accuracy_difference
        Console().print(
            f"accuracy {comparison.after.label} - {comparison.before.label}: "
            f"{diff.estimate:+.3f}, {diff.confidence:.0%} CI [{diff.low:+.3f}, {diff.high:+.3f}]"
            f" ({'paired' if diff.paired else 'unpaired'} bootstrap over problems)"
        )


def register(app: typer.Typer) -> None:
    """Add the ``eval`` command to the ``toolrollout`` app."""
    command(app, "eval", OPTIONS, eval_command)
