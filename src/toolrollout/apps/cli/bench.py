"""``toolrollout bench``: rollout throughput, side by side with the baselines.

Starts the latency-model server(s) and the tool service, runs each mode over the same
workload in its own worker process, prints a rich table with the targets, and writes the
report as JSON and (with matplotlib) as a plot. User mistakes exit with one line, code 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from toolrollout.apps.cli._common import EngineKindOption, fail, require_extra

__all__ = ["bench", "register"]


def bench(
    prompts: Annotated[int, typer.Option(min=1, help="Distinct prompts.")] = 64,
    n: Annotated[int, typer.Option("--n", min=1, help="Samples per prompt.")] = 16,
    min_turns: Annotated[int, typer.Option(min=1, help="Fewest model turns.")] = 2,
    max_turns: Annotated[int, typer.Option(min=1, help="Most model turns.")] = 6,
    tokens_per_turn: Annotated[int, typer.Option(min=1, help="Tokens per model turn.")] = 256,
    capacity: Annotated[
        int, typer.Option(min=1, help="Continuous-batching slots per server.")
    ] = 256,
    decode_ms: Annotated[
        float, typer.Option(min=0.0, help="Decode ms per token, per batching slot.")
    ] = 20.0,
    prefill_us: Annotated[
        float, typer.Option(min=0.0, help="Prefill microseconds per uncached prompt token.")
    ] = 20.0,
    tool_latency: Annotated[str, typer.Option(help="fixed or lognormal.")] = "lognormal",
    tool_median: Annotated[float, typer.Option(min=0.0, help="Median tool seconds.")] = 1.0,
    tool_sigma: Annotated[float, typer.Option(min=0.0, help="Lognormal sigma.")] = 1.0,
    mode: Annotated[
        list[str] | None,
        typer.Option(
            "--mode",
            help="toolrollout, oversample, lockstep, verifiers, httpx, aiohttp (repeatable); "
            "toolrollout:POLICY[+POLICY] runs toolrollout (oversample:POLICY the oversample "
            "mode) with scheduling policies (priority, history, admission, affinity, lag, "
            "oldest). Default: toolrollout, lockstep, httpx, aiohttp, "
            "and verifiers when it is installed.",
        ),
    ] = None,
    servers: Annotated[int, typer.Option(min=1, help="Latency-model servers.")] = 1,
    concurrency: Annotated[
        int,
        typer.Option(
            min=1,
            help="Requests each mode may have in flight: toolrollout's concurrency and every "
            "mode's connection pool.",
        ),
    ] = 4096,
    batch_fraction: Annotated[
        float,
        typer.Option(
            min=0.0, max=1.0, help="oversample mode: the batch target, a share of trajectories."
        ),
    ] = 0.875,
    drift_check: Annotated[
        bool, typer.Option(help="Run toolrollout with its per-turn drift check.")
    ] = True,
    micro_turns: Annotated[
        int, typer.Option(min=0, help="Turn N of the tokenization timing (0 skips it).")
    ] = 64,
    seed: Annotated[int, typer.Option(help="Workload and tool-latency seed.")] = 0,
    enable_priority_scheduling: Annotated[
        bool,
        typer.Option(
            "--enable-priority-scheduling",
            help="Start the servers with SGLang's --enable-priority-scheduling (modes "
            "toolrollout:priority and toolrollout:history send priorities only then).",
        ),
    ] = False,
    turn_spread: Annotated[
        int,
        typer.Option(
            min=-1,
            help="-1: every sample draws its turns on its own; N >= 0: each prompt has a "
            "typical length of its own and its samples run within N turns of it.",
        ),
    ] = -1,
    grouped: Annotated[
        bool,
        typer.Option(
            "--grouped",
            help="The n samples of a prompt share one prompt, as a GRPO trainer's do: "
            "toolrollout runs prompts x n samples and oversample's target counts whole "
            "groups. Not for the bare POST modes.",
        ),
    ] = False,
    previous_steps: Annotated[
        int,
        typer.Option(
            min=0,
            help="Training steps each toolrollout mode runs first with the same runner (the "
            "history policy learns from them); the step after them is measured.",
        ),
    ] = 0,
    engine_url: Annotated[
        str | None,
        typer.Option(
            "--engine-url",
            help="A real SGLang or vLLM server instead of the latency model: its model answers "
            "the demo's calculator prompts (modes toolrollout, lockstep, verifiers, bound; "
            "--tokens-per-turn caps each turn, the --tool-* options shape the calculator's "
            "latency). docs/benchmarks.md#real-engines.",
        ),
    ] = None,
    engine: EngineKindOption = "auto",
    rounds: Annotated[
        int,
        typer.Option(
            min=1,
            help="With --engine-url: every mode this many times, interleaved; the ratios are "
            "the medians of each round's.",
        ),
    ] = 1,
    model: Annotated[
        Path | None,
        typer.Option(help="With --engine-url: the served model's tokenizer folder (the demo's)."),
    ] = None,
    json_out: Annotated[
        Path, typer.Option("--json", help="Where to write the JSON report.")
    ] = Path("bench.json"),
    plot: Annotated[
        Path | None, typer.Option(help="Where to save the plot (needs matplotlib).")
    ] = None,
) -> None:
    """Benchmark rollout orchestration against lock-step and peer baselines.

    The defaults are the published 1,024-trajectory workload (docs/benchmarks.md): a
    GPU-like server (256 slots, 20 ms per token) and heavy-tail tools (median 1 s).
    """
    require_extra("bench", "toolrollout bench")
    import sys

    from rich.console import Console

    from toolrollout._exceptions import ToolRolloutError
    from toolrollout.apps.bench import (
        BenchConfig,
        LatencyModel,
        ServerScheduling,
        ToolLatency,
        Workload,
        default_modes,
        plot_report,
        render_table,
        run_benchmark,
        write_json,
    )

    if engine_url is not None:
        _real(engine_url, engine, model, prompts, n, max_turns, tokens_per_turn, tool_median,
              tool_sigma, seed, concurrency, mode, json_out, plot, rounds)  # fmt: skip
        return
    if min_turns > max_turns:
        raise fail(f"--min-turns {min_turns} is above --max-turns {max_turns}")
    modes = tuple(mode) if mode else default_modes(grouped=grouped)
    console = Console(stderr=True)
    try:
        config = BenchConfig(
            workload=Workload(
                prompts,
                n,
                min_turns,
                max_turns,
                tokens_per_turn,
                seed,
                turn_spread=turn_spread,
                grouped=grouped,
            ),
            model=LatencyModel(capacity, prefill_us / 1e6, decode_ms / 1e3),
            tool_latency=ToolLatency(tool_latency, tool_median, tool_sigma, seed=seed),  # type: ignore[arg-type]
            modes=modes,
            servers=servers,
            concurrency=concurrency,
            drift_check=drift_check,
            batch_fraction=batch_fraction,
            micro_turns=micro_turns,
            scheduling=ServerScheduling(enabled=enable_priority_scheduling),
            previous_steps=previous_steps,
        )
        report = run_benchmark(config, progress=lambda msg: console.print(f"[dim]{msg}[/dim]"))
        render_table(report, Console(width=None if sys.stdout.isatty() else 160))
        write_json(report, json_out)
        if plot is not None:
            plot_report(report, plot)
    except ToolRolloutError as exc:
        raise fail(str(exc)) from None
    typer.echo(f"wrote {json_out}" + (f" and {plot}" if plot is not None else ""))


def _real(
    engine_url: str,
    engine: str,
    model: Path | None,
    prompts: int,
    n: int,
    max_turns: int,
    tokens_per_turn: int,
    tool_median: float,
    tool_sigma: float,
    seed: int,
    concurrency: int,
    mode: list[str] | None,
    json_out: Path,
    plot: Path | None,
    rounds: int,
) -> None:
    """The comparison on a real server (toolrollout.apps.bench._real)."""
    import json

    from rich.console import Console

    from toolrollout._exceptions import ToolRolloutError
    from toolrollout.apps.bench._real import (
        REAL_MODES,
        RealBenchConfig,
        plot_real,
        run_real_benchmark,
    )
    from toolrollout.apps.demo import DEMO_MODEL_PATH

    console = Console(stderr=True)
    config = RealBenchConfig(
        engine_url=engine_url.rstrip("/"),
        model=str(model or DEMO_MODEL_PATH),
        prompts=prompts,
        n=n,
        max_turns=max_turns,
        max_new_tokens=tokens_per_turn,
        temperature=1.0,
        tool_median=tool_median,
        tool_sigma=tool_sigma,
        seed=seed,
        concurrency=concurrency,
        turns_file=str(json_out.with_suffix(".turns.json")),
        engine=engine,
    )
    try:
        report = run_real_benchmark(
            config,
            tuple(mode or REAL_MODES),
            progress=lambda msg: console.print(f"[dim]{msg}[/dim]"),
            rounds=rounds,
        )
    except ToolRolloutError as exc:
        raise fail(str(exc)) from None
    json_out.write_text(json.dumps(report, indent=2) + "\n")
    if plot is not None:
        plot_real(report, plot)
    for mode_name, result in report["results"].items():
        typer.echo(f"{mode_name}: {json.dumps(result)}")
    typer.echo(f"ratios: {json.dumps(report['ratios'])}")
    typer.echo(f"wrote {json_out}" + (f" and {plot}" if plot is not None else ""))


def register(app: typer.Typer) -> None:
    """Add the ``bench`` command to the ``toolrollout`` app."""
    app.command("bench")(bench)
