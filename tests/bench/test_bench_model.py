"""The benchmark's inputs and arithmetic: deterministic latencies, workloads, ideal makespan."""

from __future__ import annotations

import math
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from toolrollout._exceptions import UserError
from toolrollout.apps.bench import (
    BenchConfig,
    LatencyModel,
    ToolLatency,
    Workload,
    WorkloadItem,
    default_modes,
)
from toolrollout.apps.bench._harness import BenchReport
from toolrollout.apps.bench._metrics import (
    ModeResult,
    critical_paths,
    ideal_makespan,
    kv_bound_makespan,
    orchestration_efficiency,
    replay_makespan,
)
from toolrollout.apps.bench._model import parse_directive, parse_group_directive
from toolrollout.exceptions import BenchmarkError


def test_tool_latency_is_deterministic_per_key_and_heavy_tailed() -> None:
    dist = ToolLatency("lognormal", median=0.2, sigma=1.0, cap=1e9, seed=3)
    draws = [dist.sample(f"k{i}") for i in range(4000)]
    assert draws[:50] == [dist.sample(f"k{i}") for i in range(50)]  # same key, same latency
    assert ToolLatency("lognormal", 0.2, 1.0, 1e9, seed=4).sample("k0") != draws[0]
    assert statistics.median(draws) == pytest.approx(0.2, rel=0.1)
    # log-space spread is sigma; the tail reaches far beyond the median
    logs = [math.log(d) for d in draws]
    assert statistics.pstdev(logs) == pytest.approx(1.0, rel=0.1)
    assert max(draws) > 10 * statistics.median(draws)


def test_fixed_latency_and_cap() -> None:
    assert ToolLatency("fixed", median=0.5).sample("anything") == 0.5
    capped = ToolLatency("lognormal", median=1.0, sigma=3.0, cap=2.0)
    assert max(capped.sample(f"k{i}") for i in range(500)) == 2.0
    with pytest.raises(Exception, match="fixed or lognormal"):
        ToolLatency("uniform")  # type: ignore[arg-type]


def test_workload_items_and_directive_round_trip() -> None:
    workload = Workload(prompts=3, n=4, min_turns=2, max_turns=5, tokens_per_turn=30, seed=1)
    assert workload.trajectories == len(workload.items) == 12
    assert len({item.key for item in workload.items}) == 12
    assert all(2 <= item.turns <= 5 for item in workload.items)
    assert Workload(3, 4, 2, 5, 30, seed=1).items == workload.items
    row = workload.rows()[5]
    item = parse_directive(row["messages"][0]["content"])
    assert item == workload.items[5]
    assert item is not None and item.tool_keys() == [
        f"{item.key}.{t}" for t in range(item.turns - 1)
    ]
    assert parse_directive("What is 2 + 2?") is None
    assert "items" not in workload.to_dict()


def test_a_prompts_typical_length_holds_across_steps_only_with_a_spread() -> None:
    def lengths(workload: Workload) -> dict[str, list[int]]:
        found: dict[str, list[int]] = {}
        for item in workload.items:
            found.setdefault(item.group, []).append(item.turns)
        return found

    shape: dict[str, Any] = {
        "prompts": 40, "n": 8, "min_turns": 2, "max_turns": 6, "tokens_per_turn": 8
    }  # fmt: skip
    # step 0 without a spread is the published draw, and a later step draws again
    assert Workload(**shape).items == Workload(**shape, turn_spread=-1, step=0).items
    assert Workload(**shape, step=1).items != Workload(**shape).items
    tied = [lengths(Workload(**shape, turn_spread=0, step=step)) for step in range(3)]
    assert all(len(set(turns)) == 1 for turns in tied[0].values())  # a prompt, one length
    assert tied[0] == tied[1] == tied[2]  # the same at every step
    near = [lengths(Workload(**shape, turn_spread=1, step=step)) for step in range(2)]
    assert near[0] != near[1]  # samples drawn again...
    for group, turns in near[0].items():  # ...within one turn of the prompt's own length
        assert max(turns + near[1][group]) - min(turns + near[1][group]) <= 2
    free = lengths(Workload(**shape))
    assert sum(len(set(turns)) > 1 for turns in free.values()) > 30
    with pytest.raises(UserError, match="turn_spread"):
        Workload(**shape, turn_spread=-2)


def test_a_grouped_workload_shares_each_prompt_and_keeps_the_draws() -> None:
    plain = Workload(prompts=3, n=4, min_turns=1, max_turns=6, tokens_per_turn=30, seed=2)
    grouped = replace(plain, grouped=True)
    assert grouped.items == plain.items  # the same samples, only the prompts differ
    groups = grouped.groups()
    assert [g.key for g in groups] == ["p0", "p1", "p2"]
    for p, group in enumerate(groups):
        samples = [group.sample(s) for s in range(4)]
        assert samples == list(plain.items[p * 4 : (p + 1) * 4])
        assert parse_group_directive(group.prompt()[0]["content"]) == group
        assert parse_directive(group.prompt()[0]["content"]) is None
    rows = grouped.rows()
    assert len(rows) == 12 and rows[0] == rows[3] != rows[4]
    assert grouped.prompt_rows() == rows[::4] and grouped.samples_per_row == 4
    assert plain.prompt_rows() == plain.rows() and plain.samples_per_row == 1
    assert parse_group_directive("bench-task p0s1 turns=2 tokens=3") is None
    with pytest.raises(BenchmarkError, match=r"\['aiohttp'\] need samples with prompts"):
        BenchConfig(workload=grouped, modes=("toolrollout", "oversample", "aiohttp"))
    # the modes run when none are named: the bare POSTs only for per-sample prompts
    assert {"httpx", "aiohttp"} <= set(default_modes())
    assert not {"httpx", "aiohttp"} & set(default_modes(grouped=True))
    assert BenchConfig(workload=grouped, modes=default_modes(grouped=True)).modes[:2] == (
        "toolrollout",
        "lockstep",
    )


def test_latency_model_needs_a_slot() -> None:
    with pytest.raises(Exception, match="capacity"):
        LatencyModel(capacity=0)


def test_critical_paths_sum_each_trajectorys_generations_and_tools() -> None:
    requests: list[dict[str, Any]] = [
        {"key": "a", "slot_seconds": 1.0},
        {"key": "a", "slot_seconds": 2.0},
        {"key": "b", "slot_seconds": 0.5},
        {"key": None, "slot_seconds": 9.0},  # not a benchmark request: no trajectory
    ]
    calls = [{"key": "a.0", "seconds": 4.0}, {"key": "b.0", "seconds": 0.25}]
    paths = critical_paths(requests, calls)
    assert paths == {"a": 7.0, "b": 0.75}


def test_fifo_bound_replays_the_work_through_first_come_first_served_servers() -> None:
    # a: two turns of 1 s with a 0.5 s tool between them; b: one turn of 2 s.
    requests = [
        {"key": "a", "turn": 1, "slot_seconds": 1.0, "server": 0},
        {"key": "a", "turn": 0, "slot_seconds": 1.0, "server": 0},
        {"key": "b", "turn": 0, "slot_seconds": 2.0, "server": 0},
    ]
    calls = [{"key": "a.0", "seconds": 0.5}]
    # One slot: a(0-1), b(1-3) while a's tool ends at 1.5 and queues, a(3-4).
    assert replay_makespan(requests, calls, capacity=1) == pytest.approx(4.0)
    # Two slots: nobody queues; a's own path (2.5 s) is the makespan.
    assert replay_makespan(requests, calls, capacity=2) == pytest.approx(2.5)
    # One slot each on two servers: no queueing either.
    on_two = [{**r, "server": 1} if r["key"] == "b" else r for r in requests]
    assert replay_makespan(on_two, calls, capacity=1) == pytest.approx(2.5)
    # The ideal bound is looser than the one-slot FIFO replay: max(2.5, 4 s of work / 1).
    paths = critical_paths(requests, calls)
    assert ideal_makespan(paths, 4.0, 1) == pytest.approx(4.0)
    with pytest.raises(ValueError):
        replay_makespan(requests, calls, capacity=0)


def test_ideal_makespan_is_the_larger_of_longest_path_and_spread_work() -> None:
    paths = {"a": 7.0, "b": 0.75}
    assert ideal_makespan(paths, total_slot_seconds=12.0, capacity=4) == 7.0  # path-bound
    assert ideal_makespan(paths, total_slot_seconds=40.0, capacity=4) == 10.0  # capacity-bound
    assert ideal_makespan({}, 0.0, 1) == 0.0
    with pytest.raises(ValueError):
        ideal_makespan(paths, 1.0, 0)
    assert orchestration_efficiency(7.0, 8.0) == pytest.approx(0.875)
    assert orchestration_efficiency(7.0, 0.0) == 0.0


def test_kv_bound_is_the_decode_kv_occupancy_over_the_budget() -> None:
    # 100 prompt tokens, 10 decoded: 100 * 10 + 10 * 10 / 2 = 1,050 token-steps of KV
    requests = [{"prompt_tokens": 100, "output_tokens": 10}] * 2
    assert kv_bound_makespan(requests, 0.01, 1_000) == pytest.approx(2 * 1_050 * 0.01 / 1_000)
    assert kv_bound_makespan(requests, 0.01, 2_000) == pytest.approx(1_050 * 0.01 / 1_000)
    assert kv_bound_makespan(requests, 0.01, 0) == 0.0  # no budget, no bound
    with_bound = _result("toolrollout", kv_bound_makespan_s=8.0)
    assert with_bound.kv_efficiency == pytest.approx(0.8)
    assert _result("toolrollout").kv_efficiency == 0.0
    assert with_bound.to_dict()["kv_efficiency"] == pytest.approx(0.8)


def _result(mode: str, **kw: float) -> ModeResult:
    base = dict(
        trajectories=100, completed=100, turns=400, generated_tokens=20000, makespan_s=10.0,
        ideal_makespan_s=9.6, client_cpu_s=2.0, peak_rss_mb=300.0,
    )  # fmt: skip
    base.update(kw)
    return ModeResult(mode=mode, **base)  # type: ignore[arg-type]


def test_mode_result_rates_and_report_targets() -> None:
    ours = _result("toolrollout")
    assert ours.trajectories_per_s == 10.0
    assert ours.tokens_per_s == 2000.0
    assert ours.cpu_per_turn_ms == 5.0
    assert ours.efficiency == pytest.approx(0.96)
    assert ours.client_efficiency == 0.0  # no FIFO bound recorded
    assert _result("x", fifo_makespan_s=9.0).client_efficiency == pytest.approx(0.9)
    assert ModeResult.from_dict(ours.to_dict()) == ours
    report = BenchReport(
        config={"drift_check": True},
        results=(
            ours,
            _result("lockstep", makespan_s=25.0),
            _result("httpx", client_cpu_s=1.0),
            _result("aiohttp", client_cpu_s=4.0),
        ),
        tokenization={"turns": 64, "ratio_with_drift_check": 3.0, "ratio_without_drift_check": 1.1},
        machine={},
    )
    targets = {t["target"]: t for t in report.targets()}
    assert targets["orchestration efficiency"]["met"] is True
    assert targets["throughput vs lock-step"]["value"] == pytest.approx(2.5)
    assert targets["throughput vs lock-step"]["met"] is True
    assert targets["client CPU per turn vs bare httpx POST"]["value"] == pytest.approx(2.0)
    assert targets["client CPU per turn vs bare httpx POST"]["met"] is False
    same_transport = targets["client CPU per turn vs bare POST on the same transport (aiohttp)"]
    assert same_transport["value"] == pytest.approx(0.5)
    assert same_transport["met"] is True
    assert targets["tokenization cost turn 64 vs turn 1"]["value"] == 3.0
    assert targets["tokenization cost turn 64 vs turn 1"]["met"] is False


def test_bench_config_rejects_unknown_modes() -> None:
    with pytest.raises(BenchmarkError, match="unknown mode"):
        BenchConfig(modes=("toolrollout", "magic"))


def test_workload_item_prompt_is_a_user_message() -> None:
    item = WorkloadItem("x1", 3, 10)
    assert item.prompt() == [{"role": "user", "content": "bench-task x1 turns=3 tokens=10"}]


def test_plot_report_writes_a_png(tmp_path: Path) -> None:
    from toolrollout.apps.bench import plot_report

    report = BenchReport(
        config={
            "drift_check": True,
            "workload": {"prompts": 2, "n": 2, "min_turns": 2, "max_turns": 3},
            "tool_latency": {"kind": "lognormal"},
        },
        results=(_result("toolrollout"), _result("lockstep", makespan_s=25.0), _result("httpx")),
        tokenization=None,
        machine={"cpus": 2, "loadavg_before": [1.0, 1.0, 1.0]},
    )
    out = plot_report(report, tmp_path / "plot.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
