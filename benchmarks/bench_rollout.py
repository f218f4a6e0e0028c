"""Rollout orchestration benchmark: toolrollout vs lock-step vs verifiers vs bare POSTs.

    python benchmarks/bench_rollout.py      # the published 1,024-trajectory run
    python benchmarks/bench_rollout.py --out benchmarks/results/rollout.json \
        --plot docs/benchmarks_rollout.png   # the same, refreshing the published files
    python benchmarks/bench_rollout.py --tokens-per-turn 48 --decode-ms 2 --tool-median 0.2 \
        --out benchmarks/results/rollout_short_turns.json \
        --plot docs/benchmarks_rollout_short_turns.png   # short turns on a fast server
    python benchmarks/bench_rollout.py --modes toolrollout,oversample \
        --out benchmarks/results/rollout_oversample.json \
        --plot docs/benchmarks_rollout_oversample.png    # straggler control
    python benchmarks/bench_rollout.py --enable-priority-scheduling --turn-spread 1 \
        --previous-steps 1 --modes toolrollout,toolrollout:priority,toolrollout:history \
        --out benchmarks/results/rollout_history.json   # lengths that belong to the prompt

Writes bench_rollout.json and bench_rollout.png in the current folder by default: the
published results (benchmarks/results/, docs/) change only when asked for by --out and
--plot. The default workload is the one docs/benchmarks.md reports the issue's targets
on: 64 prompts x 16 samples, 2 to 6 turns of 256 tokens, a server with 256 batching slots
at 20 ms per token (about 12,800 tokens/s, one GPU serving a 7-8B model), tools lognormal
with median 1 s.
Everything runs on loopback: the latency-model server(s), the tool service, and one worker
process per mode. The machine's load average is recorded in the JSON and on the plot.
"""

from __future__ import annotations

import argparse
from pathlib import Path

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--n", type=int, default=16)
    parser.add_argument("--min-turns", type=int, default=2)
    parser.add_argument("--max-turns", type=int, default=6)
    parser.add_argument("--tokens-per-turn", type=int, default=256)
    parser.add_argument("--decode-ms", type=float, default=20.0, help="decode ms per token")
    parser.add_argument("--capacity", type=int, default=256, help="batching slots per server")
    parser.add_argument("--servers", type=int, default=1, help="latency-model servers")
    parser.add_argument(
        "--modes",
        help="comma-separated modes (default: all but oversample; verifiers if installed)",
    )
    parser.add_argument("--batch-fraction", type=float, default=0.875, help="oversample target")
    parser.add_argument("--kv-tokens", type=int, default=0, help="KV budget per server; 0: none")
    parser.add_argument(
        "--shared-prompt-words", type=int, default=0, help="GRPO group's shared problem text"
    )
    parser.add_argument(
        "--enable-priority-scheduling",
        action="store_true",
        help="start the servers with SGLang's --enable-priority-scheduling",
    )
    parser.add_argument("--log-dir", default="", help="keep each mode's raw logs here")
    parser.add_argument(
        "--turn-spread",
        type=int,
        default=-1,
        help="-1: every sample draws its turns on its own (published); N >= 0: each prompt "
        "has its own typical length, its samples within N turns of it",
    )
    parser.add_argument(
        "--grouped",
        action="store_true",
        help="the n samples of a prompt share one prompt (GRPO groups); oversample's target "
        "counts whole groups; not for the bare POST modes",
    )
    parser.add_argument(
        "--previous-steps",
        type=int,
        default=0,
        help="training steps each toolrollout mode runs first with the same runner "
        "(the history policy learns from them); the next step is measured",
    )
    parser.add_argument("--tool-median", type=float, default=1.0)
    parser.add_argument("--tool-sigma", type=float, default=1.0)
    # Not the tracked files under benchmarks/results/ and docs/: a trial run must not
    # overwrite the published figures silently.
    parser.add_argument("--out", type=Path, default=Path("bench_rollout.json"))
    parser.add_argument("--plot", type=Path, default=Path("bench_rollout.png"))
    args = parser.parse_args()
    modes = list(default_modes(grouped=args.grouped))
    if args.modes:
        modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    config = BenchConfig(
        workload=Workload(
            args.prompts,
            args.n,
            args.min_turns,
            args.max_turns,
            args.tokens_per_turn,
            seed=0,
            shared_prompt_words=args.shared_prompt_words,
            turn_spread=args.turn_spread,
            grouped=args.grouped,
        ),
        model=LatencyModel(
            capacity=args.capacity,
            prefill_per_token_s=20e-6,
            decode_per_token_s=args.decode_ms / 1e3,
            kv_tokens=args.kv_tokens,
        ),
        scheduling=ServerScheduling(enabled=args.enable_priority_scheduling),
        log_dir=args.log_dir,
        tool_latency=ToolLatency("lognormal", args.tool_median, args.tool_sigma, seed=0),
        modes=tuple(modes),
        servers=args.servers,
        batch_fraction=args.batch_fraction,
        micro_turns=64,
        previous_steps=args.previous_steps,
    )
    report = run_benchmark(config, progress=print)
    render_table(report)
    write_json(report, args.out)
    plot_report(report, args.plot)
    print(f"wrote {args.out} and {args.plot}")


if __name__ == "__main__":
    main()
