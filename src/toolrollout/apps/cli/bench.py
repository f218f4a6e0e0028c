"""``toolrollout bench``: rollout throughput, side by side with the baselines.

Starts the latency-model server(s) and the tool service, runs each mode over the same
workload in its own worker process, prints a rich table with the targets, and writes the
report as JSON and (with matplotlib) as a plot. User mistakes exit with one line, code 2.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from toolrollout.apps.cli._common import fail, require_extra
from toolrollout.apps.cli._options import RUN, command, opt

__all__ = ["OPTIONS", "bench", "register"]

# fmt: off
OPTIONS = [
    opt("prompts", int, 64, "Distinct prompts.", min=1),
    RUN["n"].but(type=int, default=16, help="Samples per prompt."),
    opt("min_turns", int, 2, "Fewest model turns.", min=1),
    RUN["max_turns"].but(default=6, help="Most model turns."),
    opt("tokens_per_turn", int, 256, "Tokens per model turn.", min=1),
    opt("capacity", int, 256, "Continuous-batching slots per server.", min=1),
    opt("decode_ms", float, 20.0, "Decode ms per token, per batching slot.", min=0.0),
    opt("prefill_us", float, 20.0, "Prefill microseconds per uncached prompt token.", min=0.0),
    opt("tool_latency", str, "lognormal", "fixed or lognormal."),
    opt("tool_median", float, 1.0, "Median tool seconds.", min=0.0),
    opt("tool_sigma", float, 1.0, "Lognormal sigma.", min=0.0),
    opt("mode", list[str] | None, None, "toolrollout, oversample, lockstep, verifiers, httpx, "
        "aiohttp (repeatable); toolrollout:POLICY[+POLICY] runs toolrollout "
        "(oversample:POLICY the oversample mode) with scheduling policies (priority, history, "
        "admission, affinity, lag, oldest). Default: toolrollout, lockstep, httpx, aiohttp, "
        "and verifiers when it is installed.", "--mode"),
    opt("servers", int, 1, "Latency-model servers.", min=1),
    RUN["concurrency"].but(default=4096, help="Requests each mode may have in flight: "
        "toolrollout's concurrency and every mode's connection pool."),
    opt("batch_fraction", float, 0.875, "oversample mode: the batch target, a share of "
        "trajectories.", min=0.0, max=1.0),
    opt("drift_check", bool, True, "Run toolrollout with its per-turn drift check."),
    opt("micro_turns", int, 64, "Turn N of the tokenization timing (0 skips it).", min=0),
    RUN["seed"].but(type=int, default=0, help="Workload and tool-latency seed."),
    opt("enable_priority_scheduling", bool, False, "Start the servers with SGLang's "
        "--enable-priority-scheduling (modes toolrollout:priority and toolrollout:history "
        "send priorities only then).", "--enable-priority-scheduling"),
    opt("turn_spread", int, -1, "-1: every sample draws its turns on its own; N >= 0: each "
        "prompt has a typical length of its own and its samples run within N turns of it.",
        min=-1),
    opt("grouped", bool, False, "The n samples of a prompt share one prompt, as a GRPO "
        "trainer's do: toolrollout runs prompts x n samples and oversample's target counts "
        "whole groups. Not for the bare POST modes.", "--grouped"),
    opt("previous_steps", int, 0, "Training steps each toolrollout mode runs first with the "
        "same runner (the history policy learns from them); the step after them is measured.",
        min=0),
    opt("engine_url", str | None, None, "A real SGLang or vLLM server instead of the latency "
        "model: its model answers the demo's calculator prompts (modes toolrollout, lockstep, "
        "verifiers, bound; --tokens-per-turn caps each turn, the --tool-* options shape the "
        "calculator's latency). docs/benchmarks.md#real-engines.", "--engine-url"),
    RUN["engine"],
    opt("rounds", int, 1, "With --engine-url: every mode this many times, interleaved; the "
        "ratios are the medians of each round's.", min=1),
    RUN["model"].but(help="With --engine-url: the served model's tokenizer folder (the "
        "demo's)."),
    opt("json_out", Path, Path("bench.json"), "Where to write the JSON report.", "--json"),
    opt("plot", Path | None, None, "Where to save the plot (needs matplotlib)."),
]
"""The options of ``bench``: the run options it shares (:data:`~._options.RUN`) and its own."""
# fmt: on


def bench(flags: Any) -> None:
    """Benchmark rollout orchestration against lock-step and peer baselines.

    The defaults are the published 1,024-trajectory workload (docs/benchmarks.md): a
    GPU-like server (256 slots, 20 ms per token) and heavy-tail tools (median 1 s).
    """
    require_extra("bench", "toolrollout bench")
    from rich.console import Console

    from toolrollout._exceptions import ToolRolloutError

    if flags.engine_url is None and flags.min_turns > flags.max_turns:
        raise fail(f"--min-turns {flags.min_turns} is above --max-turns {flags.max_turns}")
    console = Console(stderr=True)

    def progress(message: str) -> None:
        console.print(f"[dim]{message}[/dim]")

    try:
        if flags.engine_url is not None:
            _real(flags, progress)
        else:
            _latency_model(flags, progress)
    except ToolRolloutError as exc:
        raise fail(str(exc)) from None
    typer.echo(f"wrote {flags.json_out}" + (f" and {flags.plot}" if flags.plot is not None else ""))


def _latency_model(flags: Any, progress: Callable[[str], None]) -> None:
    """The comparison on the latency-model server(s) (toolrollout.apps.bench._harness)."""
    import sys

    from rich.console import Console

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

    config = BenchConfig(
        workload=Workload(
            flags.prompts,
            flags.n,
            flags.min_turns,
            flags.max_turns,
            flags.tokens_per_turn,
            flags.seed,
            turn_spread=flags.turn_spread,
            grouped=flags.grouped,
        ),
        model=LatencyModel(flags.capacity, flags.prefill_us / 1e6, flags.decode_ms / 1e3),
        tool_latency=ToolLatency(
            flags.tool_latency, flags.tool_median, flags.tool_sigma, seed=flags.seed
        ),
        modes=tuple(flags.mode) if flags.mode else default_modes(grouped=flags.grouped),
        servers=flags.servers,
        concurrency=flags.concurrency,
        drift_check=flags.drift_check,
        batch_fraction=flags.batch_fraction,
        micro_turns=flags.micro_turns,
        scheduling=ServerScheduling(enabled=flags.enable_priority_scheduling),
        previous_steps=flags.previous_steps,
    )
    report = run_benchmark(config, progress=progress)
    render_table(report, Console(width=None if sys.stdout.isatty() else 160))
    write_json(report, flags.json_out)
    if flags.plot is not None:
        plot_report(report, flags.plot)


def _real(flags: Any, progress: Callable[[str], None]) -> None:
    """The comparison on a real server (toolrollout.apps.bench._real)."""
    import json

    from toolrollout.apps.bench._real import (
        REAL_MODES,
        RealBenchConfig,
        plot_real,
        run_real_benchmark,
    )
    from toolrollout.apps.demo import DEMO_MODEL_PATH

    config = RealBenchConfig(
        engine_url=flags.engine_url.rstrip("/"),
        model=str(flags.model or DEMO_MODEL_PATH),
        prompts=flags.prompts,
        n=flags.n,
        max_turns=flags.max_turns,
        max_new_tokens=flags.tokens_per_turn,
        temperature=1.0,
        tool_median=flags.tool_median,
        tool_sigma=flags.tool_sigma,
        seed=flags.seed,
        concurrency=flags.concurrency,
        turns_file=str(flags.json_out.with_suffix(".turns.json")),
        engine=flags.engine,
    )
    modes = tuple(flags.mode or REAL_MODES)
    report = run_real_benchmark(config, modes, progress=progress, rounds=flags.rounds)
    flags.json_out.write_text(json.dumps(report, indent=2) + "\n")
    if flags.plot is not None:
        plot_real(report, flags.plot)
    for mode_name, result in report["results"].items():
        typer.echo(f"{mode_name}: {json.dumps(result)}")
    typer.echo(f"ratios: {json.dumps(report['ratios'])}")


def register(app: typer.Typer) -> None:
    """Add the ``bench`` command to the ``toolrollout`` app."""
    command(app, "bench", OPTIONS, bench)
