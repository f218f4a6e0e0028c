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
from typing import TYPE_CHECKING, Annotated, Any, NamedTuple

import typer

from toolrollout.apps.cli._common import (
    ChatTemplateKwargsOption,
    EngineApiKeyOption,
    EngineKindOption,
    EngineUrlsOption,
    FailoverAfterOption,
    FamilyOption,
    ModelOption,
    RequestTimeoutOption,
    RetriesOption,
    RetryBudgetOption,
    fail,
    parse_template_kwargs,
    require_extra,
)

if TYPE_CHECKING:
    from toolrollout.apps.eval._summary import Comparison, EvalSummary

__all__ = ["Baseline", "ReportTo", "eval_command", "register"]


class Baseline(StrEnum):
    """Which baseline arm to run beside the tool run."""

    NONE = "none"
    SINGLE_TURN = "single-turn"


class ReportTo(StrEnum):
    """Experiment tracker to log the run to."""

    NONE = "none"
    MLFLOW = "mlflow"
    WANDB = "wandb"


def eval_command(
    engine_url: EngineUrlsOption = None,
    engine: EngineKindOption = "auto",
    engine_api_key: EngineApiKeyOption = None,
    model: ModelOption = None,
    dataset: Annotated[
        Path | None,
        typer.Option(help="Held-out prompts (.jsonl or .parquet; verl RL layout accepted)."),
    ] = None,
    tool_config: Annotated[
        Path | None, typer.Option(help="verl-layout tool config YAML. Default: calculator.")
    ] = None,
    n: Annotated[
        int, typer.Option("--n", min=1, help="Samples per prompt; pass@k for k up to n.")
    ] = 1,
    greedy: Annotated[
        bool | None,
        typer.Option(
            "--greedy/--sampled",
            help="Greedy decoding, or sampling at --temperature. Default: greedy when --n "
            "is 1, sampled otherwise.",
        ),
    ] = None,
    temperature: Annotated[float, typer.Option(min=0.0, help="With --sampled.")] = 1.0,
    top_p: Annotated[float, typer.Option(min=0.0, max=1.0, help="With --sampled.")] = 1.0,
    baseline: Annotated[
        Baseline,
        typer.Option(help="single-turn: also run the prompts with no tools and one turn."),
    ] = Baseline.NONE,
    report_to: Annotated[ReportTo, typer.Option(help="Experiment tracker.")] = ReportTo.NONE,
    tracking_uri: Annotated[
        str | None,
        typer.Option(
            help="MLflow tracking URI or directory (default: <out-dir>/mlruns), or the W&B "
            "run directory (default: <out-dir>)."
        ),
    ] = None,
    experiment: Annotated[
        str, typer.Option(help="MLflow experiment / W&B project name.")
    ] = "toolrollout-eval",
    run_name: Annotated[str | None, typer.Option(help="Name of the tracked run.")] = None,
    compare: Annotated[
        tuple[Path, Path] | None,
        typer.Option(
            help="Compare two trajectory files (before, after) instead of running a model.",
        ),
    ] = None,
    out_dir: Annotated[
        Path, typer.Option(help="Where trajectories, report.md and figures go.")
    ] = Path("eval"),
    success_threshold: Annotated[
        float, typer.Option(help="A sample is correct when its reward is at least this.")
    ] = 0.5,
    max_turns: Annotated[int, typer.Option(min=1, help="Assistant turns per trajectory.")] = 4,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="Tokens per model turn.")] = 128,
    max_response_tokens: Annotated[
        int, typer.Option(min=1, help="Budget over all response tokens.")
    ] = 1024,
    concurrency: Annotated[int, typer.Option(min=1, help="In-flight engine requests.")] = 64,
    seed: Annotated[int, typer.Option(help="Sampling and bootstrap seed.")] = 0,
    limit: Annotated[int | None, typer.Option(min=1, help="Use the first N prompts.")] = None,
    tool_parser: Annotated[
        str | None,
        typer.Option(help="Tool-call format of the model. Default: its model family's."),
    ] = None,
    family: FamilyOption = None,
    chat_template_kwargs: ChatTemplateKwargsOption = None,
    health_timeout: Annotated[
        float, typer.Option(help="Seconds to wait for --engine-url servers to be healthy.")
    ] = 120.0,
    threads: Annotated[
        int, typer.Option(min=1, help="Torch threads of the embedded engine (1 suits tiny models).")
    ] = 1,
    request_timeout: RequestTimeoutOption = 600.0,
    retries: RetriesOption = 30,
    retry_budget: RetryBudgetOption = 60.0,
    failover_after: FailoverAfterOption = 3,
) -> None:
    """Evaluate: accuracy, pass@k, tool use, turns, latency; report with plots; tracking."""
    require_extra("eval", "toolrollout eval")
    from toolrollout._exceptions import ToolRolloutError

    comparison: Comparison | None
    try:
        if compare is not None:
            if baseline is not Baseline.NONE:
                raise fail("--compare evaluates two existing files; it runs no --baseline")
            runs, comparison, config, artifacts = _compare_files(
                compare, out_dir=out_dir, success_threshold=success_threshold, seed=seed
            )
        else:
            if greedy is None:
                greedy = n == 1
            if greedy and n > 1:
                raise fail("--greedy with --n > 1 repeats one answer; use --sampled for pass@k")
            config = {
                "model": str(model) if model else "demo",
                "dataset": str(dataset) if dataset else "demo",
                "tool_config": str(tool_config) if tool_config else "calculator",
                "engine": ",".join(engine_url) if engine_url else "embedded",
                "n": n,
                "decoding": "greedy" if greedy else "sampled",
                "temperature": 0.0 if greedy else temperature,
                "top_p": 1.0 if greedy else top_p,
                "max_turns": max_turns,
                "max_new_tokens": max_new_tokens,
                "max_response_tokens": max_response_tokens,
                "seed": seed,
                "limit": limit,
                "tool_parser": tool_parser,
                "family": family,
                "chat_template_kwargs": parse_template_kwargs(chat_template_kwargs),
                "baseline": str(baseline),
                "success_threshold": success_threshold,
            }
            runs, comparison, artifacts = _run_model(
                engine_urls=engine_url or [],
                engine=engine,
                engine_api_key=engine_api_key or None,
                model=model,
                dataset=dataset,
                tool_config=tool_config,
                config=config,
                concurrency=concurrency,
                health_timeout=health_timeout,
                threads=threads,
                out_dir=out_dir,
                client=_ClientFlags(request_timeout, retries, retry_budget, failover_after),
            )
        from toolrollout.apps.eval._report import write_report

        report = write_report(out_dir, runs, comparison=comparison)
        _print_table(runs, comparison)
        typer.echo(f"report: {report}")
        artifacts += [report, *(report.parent / f for f in _figures()), out_dir / "metrics.json"]
        if report_to is not ReportTo.NONE:
            tracked = _track(
                report_to,
                runs,
                comparison,
                config=config,
                artifacts=artifacts,
                tracking_uri=tracking_uri,
                out_dir=out_dir,
                experiment=experiment,
                run_name=run_name,
                compare_mode=compare is not None,
            )
            typer.echo(f"{tracked.backend} run {tracked.run_id} at {tracked.location}")
    except ToolRolloutError as exc:
        raise fail(str(exc)) from None
    except OSError as exc:
        raise fail(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")) from None


class _ClientFlags(NamedTuple):
    """The engine client's flags, as `generate` has them (one RunSpec builds both)."""

    request_timeout: float
    retries: int
    retry_budget: float
    failover_after: int


def _figures() -> tuple[str, ...]:
    from toolrollout.apps.eval._report import FIGURES

    return FIGURES


def _compare_files(
    paths: tuple[Path, Path], *, out_dir: Path, success_threshold: float, seed: int
) -> tuple[list[EvalSummary], Comparison, dict[str, Any], list[Path]]:
    from toolrollout._exceptions import UserError
    from toolrollout.apps.eval import compare, summarize
    from toolrollout.rollout import read_rows

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
    *,
    engine_urls: list[str],
    engine: str,
    engine_api_key: str | None,
    model: Path | None,
    dataset: Path | None,
    tool_config: Path | None,
    config: dict[str, Any],
    concurrency: int,
    health_timeout: float,
    threads: int,
    out_dir: Path,
    client: _ClientFlags,
) -> tuple[list[EvalSummary], Comparison | None, list[Path]]:
    import anyio

    from toolrollout._exceptions import UserError
    from toolrollout.apps.demo import DEMO_MODEL_PATH, demo_prompts_for_tools
    from toolrollout.apps.eval import compare, summarize
    from toolrollout.apps.eval._baseline import single_turn_runner
    from toolrollout.data import load_prompts
    from toolrollout.engines import SamplingParams
    from toolrollout.rollout import RolloutConfig, Trajectory, TrajectoryWriter
    from toolrollout.spec import RunSpec, load_parts, open_run

    from ._progress import RolloutProgress

    rollout_config = RolloutConfig(
        sampling=SamplingParams(
            max_new_tokens=config["max_new_tokens"],
            temperature=config["temperature"],
            top_p=config["top_p"],
        ),
        n=config["n"],
        max_turns=config["max_turns"],
        max_response_tokens=config["max_response_tokens"],
        concurrency=concurrency,
        seed=config["seed"],
        tool_parser=config["tool_parser"],
        family=config.get("family"),
        chat_template_kwargs=config.get("chat_template_kwargs") or {},
    )
    spec = RunSpec(
        engine_urls=tuple(engine_urls),
        engine=engine,  # type: ignore[arg-type]  # RunSpec checks it
        engine_api_key=engine_api_key,
        model=model or DEMO_MODEL_PATH,
        tool_config=tool_config,
        config=rollout_config,
        threads=threads,
        health_timeout=health_timeout,
        request_timeout=client.request_timeout,
        retries=client.retries,
        retry_budget=client.retry_budget,
        failover_after=client.failover_after,
    )
    parts = load_parts(spec)
    # Without --dataset, the demo prompt set that suits the tools (as `generate` picks it).
    prompts_path = dataset or demo_prompts_for_tools(parts.tool_names)
    prompts = load_prompts(prompts_path, limit=config["limit"])
    truths = [p.ground_truth for p in prompts if p.ground_truth is not None]
    if not truths:
        raise UserError("eval needs a ground truth per prompt ('answer' or 'ground_truth')")
    spec = spec.replace(rewards=spec.rewards_for(truths))
    out_dir.mkdir(parents=True, exist_ok=True)
    arms = [("tools", out_dir / "trajectories.parquet")]
    if config["baseline"] == Baseline.SINGLE_TURN:
        arms.insert(0, ("single-turn", out_dir / "single_turn.parquet"))

    async def main() -> dict[str, list[Trajectory]]:
        results: dict[str, list[Trajectory]] = {}
        async with open_run(spec, parts=parts) as run:
            # One arm after the other, so the latency of one is not inflated by the other.
            for label, path in arms:
                runner = run.runner
                if label != "tools":
                    runner = single_turn_runner(
                        run.engine,
                        run.tokenizer,
                        config=rollout_config,
                        rewards=spec.rewards_for(truths),
                    )
                total = len(prompts) * rollout_config.n
                with TrajectoryWriter(path) as writer, RolloutProgress(total) as progress:

                    def on_result(trajectory: Trajectory) -> None:
                        writer.write(trajectory)
                        progress.update(trajectory)

                    results[label] = await runner.run(prompts, on_result=on_result)
        return results

    results = anyio.run(main)
    threshold = float(config["success_threshold"])
    seed = int(config["seed"])
    runs = [
        summarize(
            results[label], label=label, success_threshold=threshold, seed=seed, config=config
        )
        for label, _ in arms
    ]
    comparison = compare(runs[0], runs[1], seed=seed) if len(runs) == 2 else None
    return runs, comparison, [path for _, path in arms]


def _track(
    backend: ReportTo,
    runs: list[EvalSummary],
    comparison: Comparison | None,
    *,
    config: dict[str, Any],
    artifacts: list[Path],
    tracking_uri: str | None,
    out_dir: Path,
    experiment: str,
    run_name: str | None,
    compare_mode: bool,
) -> Any:
    from toolrollout.apps.eval import log_to_mlflow, log_to_wandb

    metrics: dict[str, float] = {}
    if compare_mode:
        metrics.update(runs[0].flat_metrics(prefix="before"))
        metrics.update(runs[1].flat_metrics(prefix="after"))
    else:
        for run in runs:
            # The tool run's metrics keep their plain names; other arms get a prefix.
            metrics.update(run.flat_metrics(prefix="" if run.label == "tools" else "baseline"))
    if comparison is not None:
        metrics.update(comparison.metrics())
    if backend is ReportTo.MLFLOW:
        return log_to_mlflow(
            metrics,
            config=config,
            artifacts=artifacts,
            tracking_uri=tracking_uri or out_dir / "mlruns",
            experiment=experiment,
            run_name=run_name,
        )
    return log_to_wandb(
        metrics,
        config=config,
        artifacts=artifacts,
        directory=tracking_uri or out_dir,
        project=experiment,
        run_name=run_name,
    )


def _cell(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:.3f}"


def _print_table(runs: list[EvalSummary], comparison: Comparison | None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="toolrollout eval")
    table.add_column("metric")
    for run in runs:
        table.add_column(run.label, justify="right")
    if comparison is not None:
        table.add_column("difference", justify="right")
    names = [
        "eval/accuracy",
        *sorted(
            (k for k in runs[-1].metrics if k.startswith("eval/pass_at_")),
            key=lambda k: int(k.rsplit("_", 1)[1]),
        ),
        "rollout/reward/mean",
        "rollout/num_turns/mean",
        "tools/calls/mean",
        "tools/failure_rate",
        "tools/parse_error_rate",
        "rollout/response_tokens/mean",
        "timing/generation_s/mean",
        "timing/tools_s/mean",
        "rollout/status/failed",
    ]
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
    app.command("eval")(eval_command)
