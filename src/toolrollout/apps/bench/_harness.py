"""Runs every driver against the same servers, one after the other, in one invocation.

The harness starts the latency-model server(s) and the tool service as subprocesses on
loopback, then, per mode: resets their logs and caches, runs the driver in a fresh worker
process (so CPU time and peak memory are the driver's own), and computes the ideal
makespan from the servers' logs of that mode. Machine load is recorded before and after,
because on a shared machine it is part of every number.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from toolrollout._exceptions import BenchmarkError
from toolrollout._net import free_port, stop_popen

from ._metrics import (
    GROUP_DECILES,
    ModeResult,
    critical_paths,
    group_completion_times,
    ideal_makespan,
    kv_bound_makespan,
    measured_ends,
    peak_in_flight,
    replay,
    replay_makespan,
)
from ._model import (
    FINISH_TOOLS,
    UNPACED,
    DriverSpec,
    LatencyModel,
    ServerScheduling,
    ToolLatency,
    Workload,
    worker_flags,
)

__all__ = [
    "BenchConfig",
    "BenchReport",
    "mode_policies",
    "reset_services",
    "run_benchmark",
    "run_worker",
    "serve_benchmark_services",
]

MODES = ("toolrollout", "oversample", "lockstep", "verifiers", "httpx", "aiohttp")
_POLICY_MODES = ("toolrollout", "oversample")
BARE_MODES = ("httpx", "aiohttp")
"""The bare POST modes: they follow each sample's own script, so not a grouped workload."""


def default_modes(*, grouped: bool = False) -> tuple[str, ...]:
    """The modes a run compares when none are named: toolrollout and lock-step, verifiers
    where it is installed, and the bare POSTs unless the workload is grouped."""
    modes = ["toolrollout", "lockstep"]
    if importlib.util.find_spec("verifiers") is not None:
        modes.append("verifiers")
    if not grouped:
        modes.extend(BARE_MODES)
    return tuple(modes)


def mode_policies(mode: str) -> tuple[str, ...]:
    """The scheduling policies a mode names: ``toolrollout:priority+affinity`` -> both."""
    from toolrollout.engines import SchedulingConfig

    base, _, tail = mode.partition(":")
    if not tail:
        return ()
    if base not in _POLICY_MODES:
        raise BenchmarkError(f"only {' and '.join(_POLICY_MODES)} modes take policies: {mode!r}")
    policies = tuple(p for p in tail.split("+") if p)
    scheduling = worker_flags(policies).scheduling  # the worker's own settings set apart
    unknown = [p for p in scheduling if p not in SchedulingConfig.POLICIES]
    if unknown or not policies:
        raise BenchmarkError(
            f"unknown policy in {mode!r}; choose from {list(SchedulingConfig.POLICIES)}, "
            f"{UNPACED!r}, {FINISH_TOOLS!r} or gcN (N allocations)"
        )
    return policies


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """One benchmark invocation."""

    workload: Workload = field(default_factory=Workload)
    model: LatencyModel = field(default_factory=LatencyModel)
    tool_latency: ToolLatency = field(default_factory=ToolLatency)
    modes: tuple[str, ...] = ("toolrollout", "lockstep", "httpx")
    servers: int = 1
    concurrency: int = 4096
    """Requests each mode may have in flight at once: toolrollout's
    ``RolloutConfig.concurrency``, and every mode's connection pool
    (``connection_limits``)."""
    tokenizer: str = ""
    drift_check: bool = True
    batch_fraction: float = 0.875
    """``oversample`` mode: its batch target, as a share of the trajectories."""
    micro_turns: int = 64
    mode_timeout_s: float = 1800.0
    scheduling: ServerScheduling = field(default_factory=ServerScheduling)
    """The latency-model servers' priority-scheduling arguments (SGLang's flags)."""
    log_dir: str = ""
    """Where to keep each mode's raw server and tool logs (``<mode>.json``); "": nowhere."""
    previous_steps: int = 0
    """Training steps each toolrollout mode runs first with the same runner (what the
    ``history`` policy learns from), each sample drawn again (``Workload.step``); only the
    step after them is measured. The other modes run the measured step only."""

    def __post_init__(self) -> None:
        for mode in self.modes:
            mode_policies(mode)
        unknown = [m for m in self.modes if m.split(":", 1)[0] not in MODES]
        if unknown:
            raise BenchmarkError(f"unknown mode(s) {unknown}; choose from {list(MODES)}")
        if self.servers < 1:
            raise BenchmarkError("servers must be at least 1")
        if self.concurrency < 1:
            raise BenchmarkError("concurrency must be at least 1")
        if self.previous_steps < 0:
            raise BenchmarkError("previous_steps must not be negative")
        if not 0.0 < self.batch_fraction <= 1.0:
            raise BenchmarkError(f"batch_fraction must be in (0, 1], got {self.batch_fraction}")
        bare = [m for m in self.modes if self.workload.grouped and m in BARE_MODES]
        if bare:
            raise BenchmarkError(
                f"mode(s) {bare} need samples with prompts of their own; a grouped workload "
                "runs toolrollout, oversample, lockstep and verifiers"
            )

    def to_dict(self) -> dict[str, Any]:
        """The settings that shape the results (not the tokenizer, timeout or log folder)."""
        data = asdict(self)
        for name in ("tokenizer", "micro_turns", "mode_timeout_s", "log_dir"):
            del data[name]
        return {**data, "workload": self.workload.to_dict(), "modes": list(self.modes)}


@dataclass(frozen=True, slots=True)
class BenchReport:
    """Everything one run measured, JSON-ready via :meth:`to_dict`."""

    config: dict[str, Any]
    results: tuple[ModeResult, ...]
    tokenization: dict[str, Any] | None
    machine: dict[str, Any]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchReport:
        """A report read back from :meth:`to_dict`'s JSON (to redraw its plot, say)."""
        return cls(
            config=data["config"],
            results=tuple(ModeResult.from_dict(r) for r in data["results"]),
            tokenization=data.get("tokenization"),
            machine=data["machine"],
        )

    def result(self, mode: str) -> ModeResult | None:
        return next((r for r in self.results if r.mode == mode), None)

    def targets(self) -> list[dict[str, Any]]:
        """The issue's targets, each with the measured value and whether it was met."""
        rows: list[dict[str, Any]] = []
        ours = self.result("toolrollout")
        lock = self.result("lockstep")
        bare = self.result("httpx")
        if ours is not None:
            rows.append(_target("orchestration efficiency", ours.efficiency, ">=", 0.95))
        policies = [r for r in self.results if r.mode.startswith("toolrollout:")]
        best = max([*policies, *([ours] if ours else [])], key=lambda r: r.efficiency, default=None)
        if policies and best is not None:
            name = f"orchestration efficiency, best policy ({best.mode})"
            rows.append(_target(name, best.efficiency, ">=", 0.95))
        if ours is not None and lock is not None and lock.trajectories_per_s > 0:
            speedup = ours.trajectories_per_s / lock.trajectories_per_s
            rows.append(_target("throughput vs lock-step", speedup, ">=", 2.5))
        if policies and best is not None and lock is not None and lock.trajectories_per_s > 0:
            speedup = best.trajectories_per_s / lock.trajectories_per_s
            rows.append(_target(f"throughput vs lock-step ({best.mode})", speedup, ">=", 2.5))
        if ours is not None and bare is not None and bare.cpu_per_turn_ms > 0:
            ratio = ours.cpu_per_turn_ms / bare.cpu_per_turn_ms
            rows.append(_target("client CPU per turn vs bare httpx POST", ratio, "<=", 1.5))
        fast = self.result("aiohttp")
        if ours is not None and fast is not None and fast.cpu_per_turn_ms > 0:
            ratio = ours.cpu_per_turn_ms / fast.cpu_per_turn_ms
            name = "client CPU per turn vs bare POST on the same transport (aiohttp)"
            rows.append(_target(name, ratio, "<=", 1.5))
        if self.tokenization is not None:
            key = f"ratio_{'with' if self.config['drift_check'] else 'without'}_drift_check"
            turns = self.tokenization["turns"]
            value = float(self.tokenization[key])
            rows.append(_target(f"tokenization cost turn {turns} vs turn 1", value, "<=", 1.2))
        return rows

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "results": [r.to_dict() for r in self.results],
            "tokenization": self.tokenization,
            "targets": self.targets(),
            "machine": self.machine,
        }


def _target(name: str, value: float, op: str, goal: float) -> dict[str, Any]:
    met = value >= goal if op == ">=" else value <= goal
    return {"target": name, "value": value, "goal": f"{op} {goal}", "met": met}


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchmarkError(f"the service for {url} exited with code {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise BenchmarkError(f"{url} did not become healthy within {timeout:.0f} s")


def _process_cpu_s(pids: Sequence[int]) -> float:
    """User + system CPU seconds of ``pids`` so far, from /proc (0.0 where it is absent)."""
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return total


def _worker_env() -> dict[str, str]:
    """The environment of the benchmark's processes: one thread per numeric library."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


@contextmanager
def _service(module: str, args: list[str], pids: list[int] | None) -> Iterator[str]:
    """``python -m toolrollout.apps.bench.<module>`` on a free port; its URL once healthy."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", f"toolrollout.apps.bench.{module}", f"--port={port}", *args]
    # stderr goes to a file, not a pipe nobody reads (a full pipe would block the service).
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log, env=_worker_env())
        if pids is not None:
            pids.append(proc.pid)
        try:
            try:
                _wait_healthy(url, proc)
            except BenchmarkError as exc:
                log.seek(0)
                tail = log.read().decode(errors="replace").strip().splitlines()[-1:]
                raise BenchmarkError(f"{exc}{': ' + tail[0] if tail else ''}") from None
            yield url
        finally:
            stop_popen(proc)


@contextmanager
def serve_benchmark_services(
    config: BenchConfig, pids: list[int] | None = None
) -> Iterator[tuple[list[str], str]]:
    """Start ``config.servers`` latency-model servers and the tool service; yield URLs.

    The services' process ids are appended to ``pids`` when it is given.
    """
    model = config.model
    with ExitStack() as stack:
        # The tool service first: the servers draw shared-prompt samples from its counter.
        tool_url = stack.enter_context(_service("serve_tools", config.tool_latency.to_args(), pids))
        args = [
            f"--tokenizer={config.tokenizer}",
            f"--capacity={model.capacity}",
            f"--prefill-per-token={model.prefill_per_token_s}",
            f"--decode-per-token={model.decode_per_token_s}",
            f"--max-total-tokens={model.kv_tokens}",
            *config.scheduling.to_args(),
            f"--draw-url={tool_url}",
        ]
        engines = [
            stack.enter_context(_service("serve_model", args, pids)) for _ in range(config.servers)
        ]
        yield engines, tool_url


def _machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "loadavg": list(os.getloadavg()),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def run_worker(args: Sequence[str], *, mode: str, timeout: float) -> dict[str, Any]:
    """One mode's worker process (``_worker.py``); the JSON object on the last line of its
    output (a :class:`BenchmarkError` naming ``mode`` when it fails or times out)."""
    argv = [sys.executable, "-m", "toolrollout.apps.bench._worker", *args]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, env=_worker_env(), timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise BenchmarkError(f"mode {mode!r} did not finish within {timeout:.0f} s") from exc
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["(no output)"]
        raise BenchmarkError(f"mode {mode!r} failed: {tail[0]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _logs(
    engines: Sequence[str], tool_url: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, int]]:
    requests: list[dict[str, Any]] = []
    counts = {"retractions": 0, "preemptions": 0}
    for server, url in enumerate(engines):
        body = httpx.get(f"{url}/bench/log", timeout=60).json()
        requests.extend({**entry, "server": server} for entry in body["requests"])
        for name in counts:
            counts[name] += int(body.get(name, 0))
    calls = httpx.get(f"{tool_url}/bench/log", timeout=60).json()["calls"]
    return requests, calls, counts


def reset_services(engines: Sequence[str], tool_url: str) -> None:
    """Clear the servers' and the tool service's logs, caches and counters."""
    for url in [*engines, tool_url]:
        httpx.post(f"{url}/bench/reset", timeout=30).raise_for_status()


def _mode_result(
    config: BenchConfig,
    mode: str,
    raw: dict[str, Any],
    requests: list[dict[str, Any]],
    calls: list[dict[str, Any]],
    counts: dict[str, int],
    services_cpu: float,
) -> ModeResult:
    """One mode's row: what its worker measured, and the bounds its logged work allows."""
    paths = critical_paths(requests, calls)
    total = sum(float(r["slot_seconds"]) for r in requests)
    ideal = ideal_makespan(paths, total, config.model.capacity * config.servers)
    capacity = config.model.capacity
    oracle_ends = replay(requests, calls, capacity, order="oracle")
    return ModeResult(
        mode=mode,
        trajectories=int(raw["trajectories"]),
        completed=int(raw["completed"]),
        turns=int(raw["turns"]),
        generated_tokens=int(raw["generated_tokens"]),
        makespan_s=float(raw["makespan_s"]),
        ideal_makespan_s=ideal,
        client_cpu_s=float(raw["client_cpu_s"]),
        peak_rss_mb=float(raw["peak_rss_mb"]),
        lag_ms={k: float(v) for k, v in raw["lag_ms"].items()},
        cached_tokens=sum(int(r["cached_tokens"]) for r in requests),
        prompt_tokens=sum(int(r["prompt_tokens"]) for r in requests),
        tool_calls=len(calls),
        peak_in_flight=peak_in_flight(requests),
        target_s=float(raw.get("target_s", 0.0)),
        note=str(raw.get("note", "")),
        services_cpu_s=services_cpu,
        fifo_makespan_s=replay_makespan(requests, calls, capacity),
        oracle_makespan_s=max(oracle_ends.values(), default=0.0),
        length_makespan_s=replay_makespan(requests, calls, capacity, order="length"),
        groups_s=group_completion_times(measured_ends(requests), GROUP_DECILES),
        oracle_groups_s=group_completion_times(oracle_ends, GROUP_DECILES),
        retractions=counts["retractions"],
        preemptions=counts["preemptions"],
        kv_bound_makespan_s=kv_bound_makespan(
            requests,
            config.model.decode_per_token_s,
            # the budget the stand-in keeps between its checks (0: no budget)
            config.servers * (config.model.kv_tokens + config.model.kv_overshoot_tokens),
        ),
    )


def run_benchmark(config: BenchConfig, *, progress: Any = None) -> BenchReport:
    """Run every mode of ``config`` and return the report (nothing is printed here)."""
    from toolrollout.apps.demo import DEMO_MODEL_PATH

    if not config.tokenizer:
        from dataclasses import replace

        config = replace(config, tokenizer=str(DEMO_MODEL_PATH))
    machine_before = _machine()
    results: list[ModeResult] = []
    pids: list[int] = []
    with serve_benchmark_services(config, pids) as (engines, tool_url):
        for mode in config.modes:
            if progress is not None:
                progress(f"running {mode} ({config.workload.trajectories} trajectories)")
            reset_services(engines, tool_url)
            spec = DriverSpec(
                mode=mode,
                engine_urls=tuple(engines),
                tool_url=tool_url,
                workload={
                    **config.workload.to_dict(),
                    "step": config.workload.step + config.previous_steps,
                },
                tokenizer=config.tokenizer,
                concurrency=config.concurrency,
                drift_check=config.drift_check,
                batch_fraction=config.batch_fraction,
                policies=mode_policies(mode),
                previous_steps=config.previous_steps,
            )
            services_before = _process_cpu_s(pids)
            args = [json.dumps({**asdict(spec), "engine_urls": list(spec.engine_urls)})]
            raw = run_worker(args, mode=spec.mode, timeout=config.mode_timeout_s)
            services_cpu = _process_cpu_s(pids) - services_before
            requests, calls, counts = _logs(engines, tool_url)
            if config.log_dir:
                folder = Path(config.log_dir)
                folder.mkdir(parents=True, exist_ok=True)
                logged = {"requests": requests, "calls": calls, **counts}
                (folder / f"{mode.replace(':', '_')}.json").write_text(json.dumps(logged))
            results.append(_mode_result(config, mode, raw, requests, calls, counts, services_cpu))
    tokenization = None
    if config.micro_turns > 0:
        from transformers import AutoTokenizer

        from ._micro import tokenization_cost

        if progress is not None:
            progress(f"timing per-turn token work at turn 1 and turn {config.micro_turns}")
        tokenizer = AutoTokenizer.from_pretrained(config.tokenizer)
        tokenization = tokenization_cost(tokenizer, turns=config.micro_turns)
    machine = {**machine_before, "loadavg_after": list(os.getloadavg())}
    machine["loadavg_before"] = machine.pop("loadavg")
    return BenchReport(config.to_dict(), tuple(results), tokenization, machine)


def write_json(report: BenchReport, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.to_dict(), indent=2) + "\n")
