"""A tiny end-to-end run of the harness, and the command's user errors.

The run starts the real latency-model server and tool service as subprocesses and runs
each mode in its own worker process; it checks what was computed, never how fast.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from rich.console import Console
from typer.testing import CliRunner

from toolrollout._exceptions import BenchmarkError
from toolrollout.apps.bench import (
    BenchConfig,
    LatencyModel,
    ServerScheduling,
    ToolLatency,
    Workload,
    render_table,
    run_benchmark,
    serve_benchmark_services,
    write_json,
)
from toolrollout.apps.bench._drivers import lag_summary
from toolrollout.apps.bench._harness import BenchReport
from toolrollout.apps.cli import app


@pytest.mark.slow
def test_tiny_run_measures_every_mode_over_the_same_work(tmp_path: Path) -> None:
    workload = Workload(prompts=2, n=2, min_turns=2, max_turns=3, tokens_per_turn=24, seed=5)
    config = BenchConfig(
        workload=workload,
        model=LatencyModel(capacity=2, prefill_per_token_s=1e-5, decode_per_token_s=1e-3),
        tool_latency=ToolLatency("lognormal", median=0.02, sigma=1.0, seed=5),
        modes=("toolrollout", "lockstep", "httpx", "aiohttp"),
        micro_turns=4,
        concurrency=3,
    )
    report = run_benchmark(config)
    expected_turns = sum(item.turns for item in workload.items)
    assert [r.mode for r in report.results] == ["toolrollout", "lockstep", "httpx", "aiohttp"]
    for result in report.results:
        assert result.trajectories == result.completed == 4, result.note
        assert result.turns == expected_turns  # same script, same work in every mode
        assert result.generated_tokens > 0 and result.client_cpu_s > 0
        assert 0 < result.ideal_makespan_s <= result.makespan_s * 1.05
        # the FIFO replay is a bound too, and never below the ideal one
        assert result.ideal_makespan_s * 0.999 <= result.fifo_makespan_s
        assert result.fifo_makespan_s <= result.makespan_s * 1.05
        assert result.peak_rss_mb > 0
        # the loop's lag was sampled through the measured run (every 10 ms at most)
        lag = result.lag_ms
        assert lag is not None and 0 < lag["samples"] <= result.makespan_s / 0.01 + 1
        assert 0 <= lag["p50"] <= lag["p99"] <= lag["max"]
        assert result.services_cpu_s > 0  # the stand-in servers did work for this mode
        # the rollouts really called the tool service, once per turn but the last
        bare = result.mode in ("httpx", "aiohttp")
        expected_calls = 0 if bare else expected_turns - workload.trajectories
        assert result.tool_calls == expected_calls
        # toolrollout keeps to the concurrency of 3; the others send all 4 at once
        assert result.peak_in_flight == (3 if result.mode == "toolrollout" else 4), result.mode
    ours = report.result("toolrollout")
    assert ours is not None and "drift mismatches 0" in ours.note
    assert ours.cached_tokens > 0  # later turns hit the server's per-trajectory cache
    assert report.tokenization is not None and report.tokenization["turns"] == 4
    assert {t["target"] for t in report.targets()} == {
        "orchestration efficiency",
        "throughput vs lock-step",
        "client CPU per turn vs bare httpx POST",
        "client CPU per turn vs bare POST on the same transport (aiohttp)",
        "tokenization cost turn 4 vs turn 1",
    }
    assert len(report.machine["loadavg_before"]) == 3
    out = tmp_path / "bench.json"
    write_json(report, out)
    data = json.loads(out.read_text())
    assert BenchReport.from_dict(data).results == report.results
    assert data["config"]["workload"]["prompts"] == 2 and data["config"]["concurrency"] == 3
    assert [r["mode"] for r in data["results"]] == ["toolrollout", "lockstep", "httpx", "aiohttp"]
    console = Console(record=True, width=200)
    render_table(report, console)
    text = console.export_text()
    assert "lockstep" in text and "orchestration efficiency" in text


def test_lag_summary_counts_only_the_measured_window() -> None:
    samples = [(0.5, 900.0), *((1.0 + i / 100, float(i)) for i in range(100)), (3.0, 800.0)]
    summary = lag_summary(samples, 1.0, 2.0)  # the load before and the teardown after: out
    # the project's quantile (linear between closest ranks) over the 100 values 0..99
    assert summary == pytest.approx({"samples": 100, "p50": 49.5, "p99": 98.01, "max": 99.0})
    assert lag_summary(samples, 5.0, 6.0)["samples"] == 0


@pytest.mark.slow
def test_oversample_mode_delivers_the_batch_target_and_counts_the_aborted_work() -> None:
    workload = Workload(prompts=2, n=2, min_turns=2, max_turns=3, tokens_per_turn=24, seed=5)
    config = BenchConfig(
        workload=workload,
        model=LatencyModel(capacity=4, prefill_per_token_s=1e-5, decode_per_token_s=1e-3),
        tool_latency=ToolLatency("lognormal", median=0.05, sigma=1.5, seed=5),
        modes=("oversample",),
        batch_fraction=0.5,
        micro_turns=0,
    )
    report = run_benchmark(config)
    [result] = report.results
    assert result.mode == "oversample"
    assert result.trajectories == result.completed == 2  # half of the four, all finished
    assert "batch target 2 of 4 trajectories" in result.note
    assert result.turns >= 2 * workload.min_turns  # the batch's turns, aborted work too
    assert report.config["batch_fraction"] == 0.5
    with pytest.raises(BenchmarkError, match="batch_fraction"):
        BenchConfig(batch_fraction=0.0)


@pytest.mark.slow
def test_a_grouped_workload_runs_the_same_work_and_oversample_delivers_whole_groups() -> None:
    workload = Workload(prompts=3, n=2, min_turns=1, max_turns=4, tokens_per_turn=16,
                        seed=4, grouped=True)  # fmt: skip
    config = BenchConfig(
        workload=workload,
        model=LatencyModel(capacity=4, prefill_per_token_s=1e-5, decode_per_token_s=1e-3),
        tool_latency=ToolLatency("lognormal", median=0.05, sigma=1.5, seed=4),
        modes=("toolrollout:oldest", "lockstep", "oversample:oldest"),
        batch_fraction=0.5,
        micro_turns=0,
    )
    report = run_benchmark(config)
    expected_turns = sum(item.turns for item in workload.items)
    for mode in ("toolrollout:oldest", "lockstep"):
        result = report.result(mode)
        assert result is not None and result.trajectories == result.completed == 6, mode
        assert result.turns == expected_turns, result.note  # every sample's script, once
        assert result.tool_calls == expected_turns - workload.trajectories
        assert result.groups_s is not None and result.groups_s["100"] > 0
    oversample = report.result("oversample:oldest")
    assert oversample is not None
    assert "batch target 2 of 3 groups" in oversample.note
    assert oversample.trajectories == oversample.completed == 4  # two whole groups of two
    # the target was met before the batch came back, and after it started
    assert 0 < oversample.target_s <= oversample.makespan_s
    lockstep = report.result("lockstep")
    assert lockstep is not None and lockstep.target_s == 0.0  # it runs everything


@pytest.mark.slow
def test_a_previous_step_teaches_the_history_mode_and_only_the_next_step_is_measured() -> None:
    workload = Workload(prompts=3, n=2, min_turns=1, max_turns=4, tokens_per_turn=16,
                        seed=3, turn_spread=0)  # fmt: skip
    config = BenchConfig(
        workload=workload,
        model=LatencyModel(capacity=4, prefill_per_token_s=1e-5, decode_per_token_s=1e-3),
        tool_latency=ToolLatency("fixed", median=0.01, seed=3),
        modes=("toolrollout:history", "lockstep"),
        micro_turns=0,
        scheduling=ServerScheduling(enabled=True),
        previous_steps=1,
    )
    report = run_benchmark(config)
    measured = Workload(**{**workload.to_dict(), "step": 1})
    expected_turns = sum(item.turns for item in measured.items)
    for result in report.results:
        # the servers' logs hold the measured step alone, in both modes
        assert result.turns == expected_turns, result.note
        assert result.tool_calls == expected_turns - measured.trajectories
    history = report.result("toolrollout:history")
    assert history is not None and "previous steps 1" in history.note
    # every prompt was seen in the previous step: the measured one predicts from its own
    assert f"'own': {expected_turns}, 'pooled': 0, 'none': 0" in history.note
    assert report.config["previous_steps"] == 1


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--min-turns", "5", "--max-turns", "2"], "--min-turns 5 is above --max-turns 2"),
        (["--mode", "magic"], "unknown mode"),
        (["--tool-latency", "uniform"], "fixed or lognormal"),
        (["--concurrency", "0"], "Invalid value for '--concurrency'"),
        (["--grouped", "--mode", "httpx"], "need samples with prompts of their own"),
    ],
)
def test_bench_command_user_errors_are_one_line(args: list[str], fragment: str) -> None:
    result = CliRunner().invoke(app, ["bench", *args])
    assert result.exit_code == 2
    assert fragment in result.output
    assert "Traceback" not in result.output


@pytest.mark.slow
def test_bare_post_with_tool_makes_each_turns_tool_call() -> None:
    """The ``aiohttp+tool`` floor: the bare POSTs plus one tool call per turn but the last."""
    import anyio

    from toolrollout.apps.bench._drivers import run_driver
    from toolrollout.apps.bench._model import DriverSpec
    from toolrollout.apps.demo import DEMO_MODEL_PATH

    workload = Workload(prompts=2, n=2, min_turns=2, max_turns=3, tokens_per_turn=16, seed=5)
    config = BenchConfig(
        workload=workload,
        model=LatencyModel(capacity=4, prefill_per_token_s=1e-5, decode_per_token_s=1e-3),
        tool_latency=ToolLatency("fixed", median=0.0, seed=5),
        tokenizer=str(DEMO_MODEL_PATH),
    )
    with serve_benchmark_services(config) as (engines, tool_url):
        spec = DriverSpec(
            mode="aiohttp+tool",
            engine_urls=tuple(engines),
            tool_url=tool_url,
            workload=workload.to_dict(),
            tokenizer=config.tokenizer,
        )
        result = anyio.run(run_driver, spec)
        calls = httpx.get(f"{tool_url}/bench/log").json()["calls"]
    turns = sum(item.turns for item in workload.items)
    assert result["turns"] == turns and result["completed"] == workload.trajectories
    keys = sorted(key for item in workload.items for key in item.tool_keys())
    assert sorted(call["key"] for call in calls) == keys
