"""10,000 concurrent trajectories in one client process: memory per held token, loop lag.

Every trajectory of the run is in flight at once (``concurrency`` = the number of
trajectories), each a long multi-turn conversation: ``turns`` model turns of about
``tokens`` tokens, a tool call after every turn but the last. What is measured is the
client alone, so the engine is an **in-process stand-in at the engine seam**
(:class:`SeamEngine`, an :class:`~toolrollout.engines.Engine` that waits and answers; no
HTTP, no server process): its answers are the latency-model server's scripted turns
(``toolrollout.apps.bench._script``, tokenized in context with the demo tokenizer, float32
logprobs as SGLang reports them), computed once per turn index, and its latency is a
lognormal draw per request around ``turn_seconds`` (a fleet that gives each of 10,000
trajectories a share of its decode rate). The tool is in-process too (a lognormal wait).
Chat template, parser, tool executor, deltas and the drift check are toolrollout's own,
with the default :class:`~toolrollout.rollout.RolloutConfig` otherwise.

Reported:

* **client memory per held token**: the resident memory the run added (RSS at the sample
  holding the most tokens, less the RSS before the first trajectory started) divided by
  the tokens held then (prompt and response tokens of every live and finished
  trajectory); beside it, the exact bytes of the token storage (ids, logprobs, masks and
  the span records around them) per token, measured with ``sys.getsizeof``, and what the
  same tokens took as tuples of Python ints and floats (the representation before);
* peak RSS of the process;
* **event-loop lag**: a task sleeps ``lag_interval`` seconds again and again and records by
  how much each wake-up is late (p50, p99, max); the sampler's own pauses are left out.
  Beside it, the part of each delay that was this process's own work (its CPU time in the
  window beyond the interval): on a loaded machine the rest is time the process waited
  for a core;
* client CPU time (user + system) per turn and its share of the wall time.

    python benchmarks/bench_scale.py                  # 10,000 trajectories, results/scale.json
    python benchmarks/bench_scale.py --trajectories 500 --turns 3 --out /tmp/scale.json
"""

from __future__ import annotations

import argparse
import gc
import json
import linecache
import math
import os
import random
import resource
import statistics
import sys
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from toolrollout.apps.bench._model import WorkloadItem
from toolrollout.apps.bench._script import TOOL_NAME, TurnScript
from toolrollout.apps.bench._tools import lookup_result
from toolrollout.apps.demo import DEMO_MODEL_PATH
from toolrollout.engines import (
    Engine,
    EngineInfo,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    SamplingParams,
)
from toolrollout.rollout import (
    RolloutConfig,
    RolloutRunner,
    TokenSpan,
    Trajectory,
    TrajectoryHooks,
)
from toolrollout.rollout._state import TrajectoryState
from toolrollout.tools._limits import quantile

__all__ = ["ScaleConfig", "SeamEngine", "memory_model", "run_scale"]


@dataclass(frozen=True, slots=True)
class ScaleConfig:
    trajectories: int = 10_000
    turns: int = 6
    tokens: int = 128
    turn_seconds: float = 20.0
    """Median seconds the stand-in engine takes per request (lognormal, sigma 0.3)."""
    tool_seconds: float = 1.0
    """Median seconds of a tool call (lognormal, sigma 1.0, capped at 30 s)."""
    drift_check: bool = True
    lag_interval: float = 0.01
    sample_every: float = 2.0
    seed: int = 0
    gc_mode: str = "default"
    """``default``: the collector as Python sets it. ``freeze``: what an application may do
    (``toolrollout generate --gc-freeze``): ``gc.freeze()`` once everything is loaded, just
    before the run, so full collections skip the imported libraries' objects. ``off``: the
    collector disabled for the run, a diagnostic bound on what collections cost (not a
    setting to run with: reference cycles would never be freed)."""
    breakdown: bool = False
    """Trace allocations (tracemalloc) and report, at the sample holding the most tokens in
    flight, what is held per token by allocation site (slows the run several times)."""


def memory_model(ticks: Sequence[dict[str, float]], trajectories: int) -> dict[str, Any] | None:
    """Split the memory into a cost per held token and a cost per trajectory.

    While every trajectory is live and none has finished, only the tokens grow: the slope
    of the added RSS over the held tokens (least squares over those samples) is what one
    more token costs. What the peak sample holds beyond ``slope x tokens``, spread over the
    trajectories, is the fixed part: each live trajectory's task and state, plus the run's
    one-off allocations (modules and buffers first used during the run). None when fewer
    than three samples qualify.
    """
    steady = [t for t in ticks if t["live_trajectories"] == trajectories and not t["finished"]]
    if len(steady) < 3 or len({t["held_tokens"] for t in steady}) < 2:
        return None
    fit = statistics.linear_regression(
        [t["held_tokens"] for t in steady], [t["rss_added"] for t in steady]
    )
    peak = max(ticks, key=lambda tick: tick["live_tokens"])
    fixed = (peak["rss_added"] - fit.slope * peak["held_tokens"]) / max(trajectories, 1)
    return {
        "samples": len(steady),
        "bytes_per_held_token_at_the_margin": fit.slope,
        "fixed_bytes_per_trajectory": fixed,
        "held_tokens_per_trajectory_at_the_peak": peak["held_tokens"] / max(trajectories, 1),
    }


def _rss_bytes() -> int:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _float32(rng: random.Random, n: int) -> tuple[float, ...]:
    """``n`` logprobs with float32 values, as SGLang computes and reports them."""
    return tuple(array("f", [-rng.expovariate(4.0) for _ in range(n)]))


class SeamEngine(Engine):
    """Answers turn ``k`` of every trajectory with the scripted turn ``k``, after a wait.

    The answers are computed once (the client copies what it keeps, as it copies a parsed
    HTTP answer); nothing per request is recorded, so the engine holds no memory that grows.
    """

    def __init__(self, tokenizer: Any, config: ScaleConfig) -> None:
        script = TurnScript(tokenizer)
        item = WorkloadItem("scale", config.turns, config.tokens)
        rng = random.Random(config.seed)
        self._answers: list[tuple[tuple[int, ...], tuple[float, ...]]] = []
        for turn in range(config.turns):
            ids = tuple(script.output_ids(script.turn(item, turn)))
            self._answers.append((ids, _float32(rng, len(ids))))
        self._stop = FinishReason(type="stop", matched=script.im_end)
        self._median = config.turn_seconds
        self._rng = random.Random(config.seed + 1)
        self.busy_s = 0.0
        """CPU-side seconds spent inside :meth:`generate` (the stand-in's own work)."""

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        started = time.perf_counter()
        assert request.rid is not None
        turn = int(request.rid.rsplit("-", 2)[1][1:])
        ids, logprobs = self._answers[min(turn, len(self._answers) - 1)]
        wait = self._median * math.exp(self._rng.gauss(0.0, 0.3)) if self._median > 0 else 0.0
        self.busy_s += time.perf_counter() - started
        await anyio.sleep(wait)
        return GenerateResult(
            rid=request.rid,
            output_ids=ids,
            output_logprobs=logprobs,
            finish_reason=self._stop,
            prompt_tokens=len(request.input_ids),
            completion_tokens=len(ids),
        )

    async def abort(self, rid: str) -> None:
        return None

    async def abort_all(self) -> None:
        return None

    async def info(self) -> EngineInfo:
        return EngineInfo(
            context_length=None, vision=False, model_path=str(DEMO_MODEL_PATH), weight_version=None
        )


def _lookup_tool(config: ScaleConfig) -> Any:
    from toolrollout.tools import FunctionTool

    rng = random.Random(config.seed + 2)

    async def lookup(key: str) -> str:
        """Look up a record by its key.

        Args:
            key: the record key named in the task.
        """
        if config.tool_seconds > 0:
            wait = rng.lognormvariate(math.log(config.tool_seconds), 1.0)
            await anyio.sleep(min(wait, 30.0))
        return lookup_result(key)

    return FunctionTool.from_function(lookup, name=TOOL_NAME)


class _Registry(TrajectoryHooks):
    """Knows the live trajectories (to count the tokens they hold)."""

    def __init__(self) -> None:
        self.live: dict[str, TrajectoryState] = {}

    async def on_model_turn(self, state: TrajectoryState, turn: Any) -> None:
        self.live[state.uid] = state


@dataclass(slots=True)
class _Samples:
    lags: list[float] = field(default_factory=list)
    own: list[float] = field(default_factory=list)
    """Per wake-up: the process's CPU time in the window beyond the interval (its own work)."""
    windows: list[tuple[float, float]] = field(default_factory=list)
    """Per wake-up: the (start, end) of its window, to match stalls with collections."""
    paused: list[tuple[float, float]] = field(default_factory=list)
    ticks: list[dict[str, float]] = field(default_factory=list)
    collections: list[tuple[int, float, float, int, float]] = field(default_factory=list)
    """Every garbage collection of the run: (generation, start, seconds, objects freed,
    process CPU seconds: on a loaded machine wall seconds include waiting for a core)."""
    started: float = 0.0


def _percentile(values: Sequence[float], q: float) -> float:
    """The same quantile as ``toolrollout bench`` reports (linear between closest ranks),
    so that a p99 lag here and there means one thing; 0 for no values."""
    return quantile(sorted(values), q) if values else 0.0


def _span_bytes(span: TokenSpan) -> int:
    size = sys.getsizeof(span) + sys.getsizeof(span.id_array)
    if span.logprob_array is not None:
        size += sys.getsizeof(span.logprob_array)
    return size


def _tuple_bytes(values: Sequence[Any]) -> int:
    """A tuple of Python numbers: the tuple and each distinct number object in it."""
    seen: dict[int, int] = {}
    for value in values:
        seen.setdefault(id(value), sys.getsizeof(value))
    return sys.getsizeof(values) + sum(seen.values())


def _old_span_bytes(span: TokenSpan) -> int:
    """The same span as it was kept before (tuples of ints and floats)."""
    ids = tuple(span.id_array.tolist())  # fresh int objects, as a parsed answer has
    if span.kind == "model":
        logprobs: tuple[float, ...] = tuple(span.logprob_array or ())
    else:
        logprobs = (0.0,) * span.num_tokens  # one shared 0.0, as before
    return 64 + _tuple_bytes(ids) + _tuple_bytes(logprobs)


def token_storage(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Exact bytes per token of the token storage, now and as tuples before."""
    tokens = spans_now = spans_old = prompt_tuple = prompt_array = 0
    for trajectory in trajectories:
        tokens += len(trajectory.prompt_ids) + len(trajectory.response_ids)
        spans_now += sum(_span_bytes(s) for s in trajectory.spans) + sys.getsizeof(trajectory.spans)
        spans_old += sum(_old_span_bytes(s) for s in trajectory.spans) + sys.getsizeof(
            trajectory.spans
        )
        prompt_tuple += _tuple_bytes(trajectory.prompt_ids)
        prompt_array += sys.getsizeof(array("i", trajectory.prompt_ids))
    tokens = max(tokens, 1)
    return {
        "tokens": tokens,
        "live_bytes_per_token": (spans_now + prompt_array) / tokens,
        "finished_bytes_per_token": (spans_now + prompt_tuple) / tokens,
        "before_bytes_per_token": (spans_old + prompt_tuple) / tokens,
    }


def run_scale(config: ScaleConfig, tokenizer: Any = None) -> dict[str, Any]:
    """Run the benchmark; returns the report (see the module docstring)."""
    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(DEMO_MODEL_PATH))
    engine = SeamEngine(tokenizer, config)
    rollout = RolloutConfig(
        sampling=SamplingParams(max_new_tokens=config.tokens * 2 + 32),
        max_turns=config.turns,
        max_response_tokens=1_000_000,
        concurrency=config.trajectories,
        drift_check=config.drift_check,
    )
    registry = _Registry()
    runner = RolloutRunner(
        engine, tokenizer, [_lookup_tool(config)], config=rollout, hooks=registry
    )
    rows = [
        {"messages": WorkloadItem(f"s{i}", config.turns, config.tokens).prompt()}
        for i in range(config.trajectories)
    ]
    samples = _Samples()
    finished: list[Trajectory] = []
    held_finished = [0]
    done = anyio.Event()

    def on_result(trajectory: Trajectory) -> None:
        registry.live.pop(trajectory.uid, None)
        finished.append(trajectory)
        held_finished[0] += len(trajectory.prompt_ids) + len(trajectory.response_ids)

    async def lag_monitor() -> None:
        while not done.is_set():
            before, cpu_before = time.perf_counter(), time.process_time()
            await anyio.sleep(config.lag_interval)
            after, cpu_after = time.perf_counter(), time.process_time()
            if not any(start < after and end > before for start, end in samples.paused[-2:]):
                samples.lags.append(max(0.0, after - before - config.lag_interval))
                samples.own.append(max(0.0, cpu_after - cpu_before - config.lag_interval))
                samples.windows.append((before, after))

    snapshot: dict[str, Any] = {"live_tokens": 0}

    async def sampler(base_rss: int, started: float) -> None:
        while not done.is_set():
            await anyio.sleep(config.sample_every)
            begin = time.perf_counter()
            live = sum(
                len(s.transcript.prompt_ids) + s.transcript.response_len
                for s in list(registry.live.values())
            )
            if config.breakdown and live > snapshot["live_tokens"] * 1.05:
                import tracemalloc

                snapshot.update(
                    live_tokens=live,
                    held_tokens=live + held_finished[0],
                    snapshot=tracemalloc.take_snapshot(),
                )
            samples.ticks.append(
                {
                    "t": begin - started,
                    "live_trajectories": len(registry.live),
                    "finished": len(finished),
                    "live_tokens": live,
                    "held_tokens": live + held_finished[0],
                    "rss_added": _rss_bytes() - base_rss,
                }
            )
            samples.paused.append((begin, time.perf_counter()))

    async def main() -> dict[str, float]:
        base_rss = _rss_bytes()
        started, cpu = time.perf_counter(), _cpu_s()
        samples.started = started
        async with anyio.create_task_group() as tg:
            tg.start_soon(lag_monitor)
            tg.start_soon(sampler, base_rss, started)
            await runner.run(rows, on_result=on_result)
            done.set()
        wall, cpu = time.perf_counter() - started, _cpu_s() - cpu
        return {"base_rss": base_rss, "wall_s": wall, "cpu_s": cpu}

    if config.breakdown:
        import tracemalloc

        tracemalloc.start(32)
    gc_started: list[float] = [0.0, 0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_started[:] = time.perf_counter(), time.process_time()
        else:
            now, cpu = time.perf_counter(), time.process_time()
            samples.collections.append(
                (
                    info["generation"],
                    gc_started[0],
                    now - gc_started[0],
                    info["collected"],
                    cpu - gc_started[1],
                )
            )

    gc.callbacks.append(on_gc)
    if config.gc_mode == "freeze":
        gc.freeze()
    elif config.gc_mode == "off":
        gc.disable()
    frozen = gc.get_freeze_count()
    try:
        measured = anyio.run(main)
    finally:
        gc.callbacks.remove(on_gc)
        gc.enable()
        gc.unfreeze()
    if config.breakdown:
        tracemalloc.stop()
    rss_end = _rss_bytes() - measured["base_rss"]
    turns = sum(t.num_turns for t in finished)
    peak = max(samples.ticks, key=lambda tick: tick["live_tokens"], default=None)
    storage = token_storage(finished)
    return {
        "config": {
            "trajectories": config.trajectories,
            "turns": config.turns,
            "tokens_per_turn": config.tokens,
            "turn_seconds": config.turn_seconds,
            "tool_seconds": config.tool_seconds,
            "drift_check": config.drift_check,
            "gc_mode": config.gc_mode,
            "gc_frozen_objects": frozen,
            "engine": "in-process stand-in at the engine seam (no HTTP)",
        },
        "statuses": _count(str(t.status) for t in finished),
        "turns": turns,
        "wall_s": measured["wall_s"],
        "client_cpu_s": measured["cpu_s"],
        "cpu_per_turn_ms": 1000 * measured["cpu_s"] / max(turns, 1),
        "engine_stand_in_cpu_s": engine.busy_s,
        "cpu_share_of_wall": measured["cpu_s"] / measured["wall_s"],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "base_rss_mb": measured["base_rss"] / 2**20,
        "in_flight_peak": peak,
        "rss_bytes_per_held_token_in_flight": (
            0.0 if peak is None else peak["rss_added"] / max(peak["held_tokens"], 1)
        ),
        "rss_bytes_per_held_token_at_end": rss_end / max(storage["tokens"], 1),
        "memory_model": memory_model(samples.ticks, config.trajectories),
        "token_storage": storage,
        "lag_ms": {
            "samples": len(samples.lags),
            "p50": 1000 * _percentile(samples.lags, 0.50),
            "p99": 1000 * _percentile(samples.lags, 0.99),
            "max": 1000 * max(samples.lags, default=0.0),
            "mean": 1000 * (statistics.fmean(samples.lags) if samples.lags else 0.0),
        },
        "lag_own_work_ms": {
            "p50": 1000 * _percentile(samples.own, 0.50),
            "p99": 1000 * _percentile(samples.own, 0.99),
            "max": 1000 * max(samples.own, default=0.0),
        },
        "gc": _gc_report(samples),
        "ticks": samples.ticks,
        **({"breakdown": _breakdown(snapshot)} if config.breakdown else {}),
        "machine": {"cpus": os.cpu_count(), "loadavg": list(os.getloadavg())},
    }


def _breakdown(snapshot: dict[str, Any]) -> dict[str, Any]:
    """Traced bytes held per token at the snapshot, by the allocating line of toolrollout
    (the innermost frame in toolrollout's sources; else the innermost one)."""
    if "snapshot" not in snapshot:
        return {}
    held = max(int(snapshot["held_tokens"]), 1)
    sites: dict[str, int] = {}
    parts: dict[str, int] = {}
    total = 0
    for trace in snapshot["snapshot"].traces:
        frames = list(reversed(trace.traceback))  # most recent call first
        site = next(
            (f for f in frames if "toolrollout/" in f.filename),
            frames[0],
        )
        name = site.filename.rsplit("/src/", 1)[-1].rsplit("site-packages/", 1)[-1]
        key = f"{name}:{site.lineno}"
        sites[key] = sites.get(key, 0) + trace.size
        part = _part(name, linecache.getline(site.filename, site.lineno))
        parts[part] = parts.get(part, 0) + trace.size
        total += trace.size
    top = sorted(sites.items(), key=lambda item: -item[1])[:25]
    return {
        "held_tokens": held,
        "live_tokens": int(snapshot["live_tokens"]),
        "traced_bytes_per_held_token": total / held,
        "by_site_bytes_per_held_token": {key: size / held for key, size in top},
        "by_part_bytes_per_held_token": {
            part: size / held for part, size in sorted(parts.items(), key=lambda kv: -kv[1])
        },
    }


def _part(name: str, source_line: str) -> str:
    """What a traced allocation site holds, in the words of docs/benchmarks.md's table
    (``name``: the site's file, from ``toolrollout/``; ``source_line``: its text)."""
    if "_records/_trajectory.py" in name:
        return "token storage (ids, float32 logprobs)"
    if name.endswith("rollout/_loop.py") and "to_thread.run_sync" in source_line:
        return "waiting for the drift-check thread"
    if "rollout/_runner.py" in name:
        return "the trajectory's task, task group entry and deadline"
    if "chat/parsers" in name or "chat/families/_family.py" in name:
        return "parsed turns and messages (text, tool calls)"
    if "rollout/_parts.py" in name or "chat/_format.py" in name:
        return "prompt and template renders"
    if "tools/" in name or "bench/_tools.py" in name:
        return "tool calls and results"
    if name.startswith("toolrollout/"):
        return "state, spans, counters, requests"
    return "outside toolrollout"


def _overlap(
    collection: tuple[int, float, float, int, float], before: float, after: float
) -> float:
    """Seconds of ``collection`` inside the window ``[before, after]``."""
    start, end = collection[1], collection[1] + collection[2]
    return max(0.0, min(after, end) - max(before, start))


def _gc_report(samples: _Samples) -> dict[str, Any]:
    """Collections by generation, and how much of the longest stalls they were."""
    by_gen: dict[str, dict[str, float]] = {}
    for generation, _start, seconds, freed, cpu in samples.collections:
        row = by_gen.setdefault(
            str(generation),
            {"count": 0, "total_s": 0.0, "max_s": 0.0, "cpu_s": 0.0, "max_cpu_s": 0.0, "freed": 0},
        )
        row["count"] += 1
        row["total_s"] += seconds
        row["max_s"] = max(row["max_s"], seconds)
        row["cpu_s"] += cpu
        row["max_cpu_s"] = max(row["max_cpu_s"], cpu)
        row["freed"] += freed
    order = sorted(range(len(samples.lags)), key=lambda i: -samples.lags[i])
    stalls = []
    for i in order[:10]:
        before, after = samples.windows[i]
        inside = [c for c in samples.collections if _overlap(c, before, after) > 0]
        stalls.append(
            {
                "at_s": before - samples.started,
                "lag_ms": 1000 * samples.lags[i],
                "own_work_ms": 1000 * samples.own[i],
                "gc_ms": 1000 * sum(_overlap(c, before, after) for c in inside),
                "gc_generations": sorted({c[0] for c in inside}),
            }
        )
    # the p99 wake-ups: how many had a collection inside, and how much of them it was
    p99 = _percentile(samples.lags, 0.99)
    late = [i for i in range(len(samples.lags)) if samples.lags[i] >= p99 and p99 > 0]
    late_gc = 0.0
    late_with_gc = 0
    for i in late:
        before, after = samples.windows[i]
        spent = sum(_overlap(c, before, after) for c in samples.collections)
        late_gc += spent
        late_with_gc += spent > 0
    return {
        "by_generation": by_gen,
        "longest_stalls": stalls,
        "wake_ups_at_or_over_p99": len(late),
        "of_them_with_a_collection": late_with_gc,
        "collection_share_of_their_lag": late_gc / max(sum(samples.lags[i] for i in late), 1e-9),
    }


def _count(values: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for value in values:
        out[value] = out.get(value, 0) + 1
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    defaults = ScaleConfig()
    parser.add_argument("--trajectories", type=int, default=defaults.trajectories)
    parser.add_argument("--turns", type=int, default=defaults.turns)
    parser.add_argument("--tokens", type=int, default=defaults.tokens)
    parser.add_argument("--turn-seconds", type=float, default=defaults.turn_seconds)
    parser.add_argument("--tool-seconds", type=float, default=defaults.tool_seconds)
    parser.add_argument("--no-drift-check", action="store_true")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument(
        "--gc",
        choices=("default", "freeze", "off"),
        default=defaults.gc_mode,
        help="garbage collector during the run (see ScaleConfig.gc_mode)",
    )
    parser.add_argument(
        "--breakdown", action="store_true", help="bytes per held token by allocation site"
    )
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "scale.json"
    )
    args = parser.parse_args(argv)
    config = ScaleConfig(
        trajectories=args.trajectories,
        turns=args.turns,
        tokens=args.tokens,
        turn_seconds=args.turn_seconds,
        tool_seconds=args.tool_seconds,
        drift_check=not args.no_drift_check,
        seed=args.seed,
        gc_mode=args.gc,
        breakdown=args.breakdown,
    )
    report = run_scale(config)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "ticks"}, indent=2))


if __name__ == "__main__":
    main()
