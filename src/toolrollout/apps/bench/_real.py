"""``toolrollout bench --engine-url``: the rollout comparison on a real server.

A real server (SGLang or vLLM, found by :func:`~toolrollout.engines._factory.connect`)
serves the comparison instead of the latency model: its model answers the demo's
calculator prompts, and the calculator takes a deterministic heavy-tailed latency (the same
seconds for the same call in every mode). The modes (``_real_modes``, each in its own worker
process) are ``toolrollout``, ``lockstep`` and ``verifiers`` as in the latency-model
comparison, and ``bound``: toolrollout's own model turns sent again by a bare loop (same
input ids, same number of new tokens), what the server alone needs for those generations.
Client and server share the machine's cores: the report records the client's CPU affinity,
every mode's client CPU and the load average before and after.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import anyio

from ._harness import run_worker
from ._real_modes import REAL_MODES, RealBenchConfig, warm_up

__all__ = ["plot_real", "run_real_benchmark"]


def _machine() -> dict[str, Any]:
    return {
        "load_average": list(os.getloadavg()),
        "client_cpus": sorted(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _server(url: str) -> dict[str, Any]:
    import httpx

    out: dict[str, Any] = {"url": url}
    for path in ("/version", "/server_info"):
        try:
            answer = httpx.get(url + path, timeout=10.0)
        except httpx.HTTPError:
            continue
        if answer.status_code == 200 and path == "/version":
            out["vllm_version"] = answer.json().get("version")
        elif answer.status_code == 200:
            out["sglang_version"] = answer.json().get("version")
    return out


def ratios(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Makespan ratios: toolrollout over the bound, each baseline over toolrollout."""
    span = {m: r["makespan_s"] for m, r in results.items() if "makespan_s" in r}
    out: dict[str, float] = {}
    if "toolrollout" in span and "bound" in span:
        out["toolrollout_over_bound"] = span["toolrollout"] / span["bound"]
    for other in ("lockstep", "verifiers"):
        if other in span and "toolrollout" in span:
            out[f"{other}_over_toolrollout"] = span[other] / span["toolrollout"]
    return out


def plot_real(report: dict[str, Any], path: Path) -> None:
    """Makespan and client CPU per mode, the load average in the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = report["results"]
    modes = [m for m in REAL_MODES if m in results and "makespan_s" in results[m]]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4))
    left.bar(modes, [results[m]["makespan_s"] for m in modes], color="tab:blue")
    left.set_ylabel("makespan (s)")
    left.set_title(f"{report['engine']} : {report['workload']['trajectories']} trajectories")
    right.bar(modes, [results[m]["client_cpu_s"] for m in modes], color="tab:orange")
    right.set_ylabel("client CPU (s)")
    right.set_title(f"load average {report['machine_before']['load_average'][0]:.1f}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def run_real_benchmark(
    config: RealBenchConfig,
    modes: Sequence[str],
    *,
    progress: Callable[[str], None] | None = None,
    timeout: float = 3600.0,
    rounds: int = 1,
) -> dict[str, Any]:
    """Run ``modes`` one after another against ``config.engine_url``; the report as a dict.

    ``bound`` replays the ``toolrollout`` mode's turns, so it needs that mode too. The
    verifiers mode is reported as skipped where the package is not installed. With
    ``rounds`` > 1 every mode runs that many times, interleaved; ``ratios`` are the medians
    of each round's ratios (paired: measured minutes apart, not a run apart) and
    ``results`` the median round of each mode.
    """
    from toolrollout._exceptions import UserError

    unknown = [m for m in modes if m not in REAL_MODES]
    if unknown:
        raise UserError(
            f"--engine-url runs the modes {', '.join(REAL_MODES)}; got {', '.join(unknown)}"
        )
    if "bound" in modes and "toolrollout" not in modes:
        raise UserError("--mode bound replays the toolrollout mode's turns: name both")
    turns_file = Path(config.turns_file)
    report: dict[str, Any] = {
        "server": _server(config.engine_url),
        "workload": {**asdict(config), "trajectories": config.prompts * config.n},
        "machine_before": _machine(),
        "results": {},
    }
    report["engine"] = "vLLM" if "vllm_version" in report["server"] else "SGLang"
    if progress is not None:
        progress("warm-up ...")
    report["warm_up_s"] = anyio.run(warm_up, config)
    order = sorted(set(modes), key=REAL_MODES.index)
    rounds_out: list[dict[str, Any]] = []
    try:
        for round_index in range(rounds):
            # toolrollout first (the bound replays its turns); the others rotate from round
            # to round, so load that drifts over the run does not always hit the same mode.
            others = [m for m in order if m != "toolrollout"]
            shift = round_index % len(others) if others else 0
            ordered = [m for m in order if m == "toolrollout"] + others[shift:] + others[:shift]
            if "bound" in ordered and "toolrollout" in ordered:
                ordered.remove("bound")
                ordered.insert(1, "bound")
            results: dict[str, Any] = {}
            for mode in ordered:
                results[mode] = _run_mode(mode, config, timeout, progress, round_index)
            rounds_out.append(results)
    finally:
        turns_file.unlink(missing_ok=True)
    report["rounds"] = rounds_out
    report["results"] = _median_round(rounds_out)
    by_round = [ratios(r) for r in rounds_out]
    report["ratios_by_round"] = by_round
    report["ratios"] = {
        k: statistics.median(r[k] for r in by_round) for k in (by_round[0] if by_round else {})
    }
    report["machine_after"] = _machine()
    return report


def _run_mode(
    mode: str,
    config: RealBenchConfig,
    timeout: float,
    progress: Callable[[str], None] | None,
    round_index: int,
) -> dict[str, Any]:
    """One mode in a worker process; the toolrollout mode's turns go to the turns file."""
    import importlib.util

    from toolrollout._exceptions import BenchmarkError

    if mode == "verifiers" and importlib.util.find_spec("verifiers") is None:
        return {"skipped": "verifiers is not installed"}
    if progress is not None:
        progress(f"round {round_index + 1}: {mode} ...")
    args = [mode, json.dumps(asdict(config))]
    result = run_worker(args, mode=mode, timeout=timeout)
    if result.get("errors"):  # a makespan of failed rows measures nothing
        raise BenchmarkError(
            f"mode {mode!r}: {result['errors']} of {result['trajectories']} "
            "trajectories failed (is the server alive? see its log)"
            + (f"; the first: {result['first_error']}" if result.get("first_error") else "")
        )
    if mode == "toolrollout":  # what the bound replays
        Path(config.turns_file).write_text(json.dumps(result.pop("model_turns")))
    return result


def _median_round(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per mode, the round with the median makespan (the lower middle one of an even count)."""
    out: dict[str, Any] = {}
    for mode in rounds[0] if rounds else {}:
        runs = sorted((r[mode] for r in rounds), key=lambda result: result.get("makespan_s", 0.0))
        out[mode] = runs[(len(runs) - 1) // 2]
    return out
