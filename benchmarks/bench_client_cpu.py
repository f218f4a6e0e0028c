"""Client CPU per turn: toolrollout against bare POSTs on the same transport, interleaved.

    python benchmarks/bench_client_cpu.py                 # 3 rounds of each mode
    python benchmarks/bench_client_cpu.py --rounds 5 --out benchmarks/results/client_cpu.json
    python benchmarks/bench_client_cpu.py --profile /tmp/prof   # py-spy raw profile per mode
    python benchmarks/bench_client_cpu.py --modes toolrollout,aiohttp,toolrollout:gc100000,\
        aiohttp:gc100000         # and each with a larger collector threshold

The latency-model server and the tool service start once; each round then runs every mode
in a fresh worker process (its CPU time is its own, every thread included), in turn, so a
change of the machine's load hits all modes alike. What counts is each mode's process CPU
per model turn as a ratio to the bare aiohttp POST **of the same round**; the median of the
rounds' ratios is reported. Wall time is not used (the machine is shared).

The modes: ``toolrollout`` (RolloutRunner over SGLangClient, drift check on), ``aiohttp``
(bare POSTs of the same conversations over toolrollout's transport: no tools, no
tokenization) and ``aiohttp+tool`` (the same bare POSTs plus the turn's tool call over the
same transport, the floor of a turn that calls a tool). A mode named ``MODE:gcN`` is
``MODE`` in a worker whose collector takes the youngest generation after N allocations (as
``generate --gc-threshold N`` does); its ratio is to ``aiohttp:gcN`` when that runs too.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from toolrollout.apps.bench import BenchConfig, LatencyModel, ToolLatency, Workload
from toolrollout.apps.bench._harness import reset_services, serve_benchmark_services
from toolrollout.apps.bench._model import DriverSpec


def _run(spec: DriverSpec, profile: Path | None, tag: str, src: str | None) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    if src is not None:  # another checkout's toolrollout (the code before a change)
        env["PYTHONPATH"] = src
    payload = json.dumps({**asdict(spec), "engine_urls": list(spec.engine_urls)})
    command = [sys.executable, "-m", "toolrollout.apps.bench._worker", payload]
    if profile is not None:
        py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        out = profile / f"{tag}.txt"
        command = [py_spy, "record", "--format", "raw", "-r", "250", "-o", str(out), "--"]
        command += [sys.executable, "-m", "toolrollout.apps.bench._worker", payload]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{spec.mode} failed:\n{done.stderr[-3000:]}")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _baseline(mode: str, row: dict[str, Any]) -> str | None:
    """The bare POST a mode's CPU is a ratio to: ``aiohttp`` with the same collector."""
    _, _, collector = mode.partition(":")
    for name in (f"aiohttp:{collector}" if collector else "aiohttp", "aiohttp"):
        if name in row:
            return name
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--tokens-per-turn", type=int, default=256)
    parser.add_argument("--decode-ms", type=float, default=1.0)
    parser.add_argument("--tool-median", type=float, default=0.05)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default="toolrollout,aiohttp,aiohttp+tool")
    parser.add_argument(
        "--before",
        metavar="SRC",
        help="also run mode 'before': toolrollout imported from this src folder (another "
        "checkout, e.g. the main branch), side by side with this one",
    )
    parser.add_argument("--profile", type=Path, help="write a py-spy raw profile per run here")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args()
    from toolrollout.apps.demo import DEMO_MODEL_PATH

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if args.before:
        modes.insert(0, "before")
    workload = Workload(args.prompts, args.n, 2, 6, args.tokens_per_turn, seed=0)
    config = BenchConfig(
        workload=workload,
        model=LatencyModel(capacity=256, decode_per_token_s=args.decode_ms / 1e3),
        tool_latency=ToolLatency("lognormal", args.tool_median, 1.0, seed=0),
        modes=("toolrollout",),
        tokenizer=str(DEMO_MODEL_PATH),
    )
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    rounds: list[dict[str, dict[str, float]]] = []
    load_before = list(os.getloadavg())
    with serve_benchmark_services(config) as (engines, tool_url):
        for number in range(args.rounds):
            row: dict[str, dict[str, float]] = {}
            for mode in modes:
                reset_services(engines, tool_url)
                base_mode, _, collector = mode.partition(":")
                spec = DriverSpec(
                    mode="toolrollout" if base_mode == "before" else base_mode,
                    engine_urls=tuple(engines),
                    tool_url=tool_url,
                    workload=workload.to_dict(),
                    tokenizer=config.tokenizer,
                    policies=(collector,) if collector else (),
                )
                tag = f"{mode.replace('+', '_').replace(':', '_')}-{number}"
                raw = _run(spec, args.profile, tag, args.before if base_mode == "before" else None)
                per_turn = 1e3 * float(raw["client_cpu_s"]) / max(int(raw["turns"]), 1)
                row[mode] = {
                    "cpu_per_turn_ms": per_turn,
                    "turns": int(raw["turns"]),
                    "client_cpu_s": float(raw["client_cpu_s"]),
                    "makespan_s": float(raw["makespan_s"]),
                    "peak_rss_mb": float(raw["peak_rss_mb"]),
                }
            rounds.append(row)
            line = ", ".join(
                f"{m} {v['cpu_per_turn_ms']:.2f} ms"
                + (f" ({v['cpu_per_turn_ms'] / row[b]['cpu_per_turn_ms']:.2f}x)" if b else "")
                for m, v in row.items()
                for b in [_baseline(m, row)]
            )
            print(f"round {number + 1}: {line}  load {os.getloadavg()[0]:.1f}", flush=True)
    summary: dict[str, Any] = {}
    for mode in modes:
        values = [r[mode]["cpu_per_turn_ms"] for r in rounds]
        entry: dict[str, Any] = {"cpu_per_turn_ms": values, "median_ms": statistics.median(values)}
        baseline = _baseline(mode, rounds[0])
        if baseline is not None:
            ratios = [r[mode]["cpu_per_turn_ms"] / r[baseline]["cpu_per_turn_ms"] for r in rounds]
            entry["baseline"] = baseline
            entry["ratio_to_aiohttp"] = ratios
            entry["median_ratio_to_aiohttp"] = statistics.median(ratios)
        summary[mode] = entry
        print(f"{mode}: median {entry['median_ms']:.2f} ms/turn"
              + (f", median ratio {entry['median_ratio_to_aiohttp']:.2f}x"
                 if "median_ratio_to_aiohttp" in entry else ""))  # fmt: skip
    if args.out is not None:
        report = {
            "workload": workload.to_dict(),
            "decode_ms": args.decode_ms,
            "tool_median_s": args.tool_median,
            "rounds": rounds,
            "summary": summary,
            "machine": {
                "cpus": os.cpu_count(),
                "loadavg_before": load_before,
                "loadavg_after": list(os.getloadavg()),
            },
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
