"""The shared metric names and the batch metrics they label, on hand-built trajectories."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
from tests._trajectories import make

from toolrollout.metrics import rollout_metrics
from toolrollout.metrics._scheme import TERMINAL_STATUSES, SampleStats, metric_key, sample_stats
from toolrollout.rollout import Trajectory, TrajectoryStatus, read_rows, write_trajectories


@pytest.fixture
def batch() -> list[Trajectory]:
    return [
        make(0, tool_stats={"calculator": (2, 1, 0.4)}, turns=3, generation=2.0, tools_s=1.0),
        make(1, tool_stats={"calculator": (1, 0, 0.1), "search": (1, 1, 0.9)}, reward=0.0),
        make(2, status=TrajectoryStatus.FAILED, reward=None, turns=1, parse_errors=2),
        make(3, status=TrajectoryStatus.TRUNCATED, reward=0.5, turns=4, model_tokens=9),
    ]


def test_batch_metrics_match_a_hand_count(batch: list[Trajectory]) -> None:
    m = rollout_metrics(batch)
    assert m["rollout/trajectories"] == 4
    # rewards 1.0, 0.0, 0.5 (the failed one has none and is not averaged in)
    assert m["rollout/reward/mean"] == pytest.approx(0.5)
    assert m["rollout/reward/std"] == pytest.approx(math.sqrt((0.25 + 0.25 + 0) / 3))
    assert (m["rollout/reward/min"], m["rollout/reward/max"]) == (0.0, 1.0)
    assert m["rollout/status/completed"] == 0.5
    assert m["rollout/status/failed"] == m["rollout/status/truncated"] == 0.25
    assert m["rollout/status/aborted"] == 0.0
    assert m["rollout/num_turns/mean"] == pytest.approx((3 + 2 + 1 + 4) / 4)
    assert (m["rollout/num_turns/min"], m["rollout/num_turns/max"]) == (1, 4)
    assert m["rollout/response_tokens/mean"] == pytest.approx((8 + 8 + 8 + 12) / 4)
    assert m["rollout/model_tokens/mean"] == pytest.approx((5 + 5 + 5 + 9) / 4)
    # 4 executed calls, 2 failed; 2 malformed calls out of 4 + 2 attempted
    assert m["tools/calls/sum"] == 4
    assert m["tools/calls/mean"] == 1.0
    assert m["tools/used_fraction"] == 0.5
    assert m["tools/failure_rate"] == 0.5
    assert m["tools/parse_error_rate"] == pytest.approx(2 / 6)
    assert m["tools/calculator/calls"] == 3
    assert m["tools/calculator/calls_per_trajectory"] == 0.75
    assert m["tools/calculator/failure_rate"] == pytest.approx(1 / 3)
    assert m["tools/calculator/latency_s/mean"] == pytest.approx(0.5 / 3)
    assert m["tools/search/failure_rate"] == 1.0
    assert m["timing/generation_s/sum"] == pytest.approx(2.0 + 1.0 * 3)
    assert m["timing/tools_s/mean"] == pytest.approx((1.0 + 0.5 * 3) / 4)
    assert m["timing/total_s/mean"] == 2.0
    assert m["timing/tools_share"] == pytest.approx(2.5 / (5.0 + 2.5))


def test_rates_without_calls_are_zero_and_empty_stats_nan() -> None:
    m = rollout_metrics([make(0, reward=None, status=TrajectoryStatus.FAILED)])
    assert m["tools/failure_rate"] == m["tools/parse_error_rate"] == 0.0
    assert math.isnan(m["rollout/reward/mean"])
    assert math.isnan(rollout_metrics([])["rollout/num_turns/mean"])


def test_rows_read_back_from_parquet_give_the_same_metrics(
    batch: list[Trajectory], tmp_path: Path
) -> None:
    for name in ("t.parquet", "t.jsonl"):
        path = write_trajectories(batch, tmp_path / name)
        rows = read_rows(path)
        assert rollout_metrics(rows) == rollout_metrics(batch)
        assert [sample_stats(r) for r in rows] == [sample_stats(t) for t in batch]


def test_rows_of_older_files_without_new_fields_still_read() -> None:
    row = make(0, source="x").to_row()
    del row["data_source"]
    row["metrics"] = '{"generation_seconds": 1.0, "tool_seconds": 0.0}'
    stats = sample_stats(row)
    assert isinstance(stats, SampleStats)
    assert stats.data_source is None and stats.total_seconds is None
    assert math.isnan(rollout_metrics([row])["timing/total_s/mean"])


def test_metric_key_keeps_names_trackers_accept() -> None:
    assert (
        metric_key("tools", "web.search-v2", "failure_rate") == "tools/web.search-v2/failure_rate"
    )
    assert metric_key("by_source", "openai/gsm8k") == "by_source/openai_gsm8k"
    assert metric_key("tools", "ünï@code", "calls") == "tools/_n_code/calls"


def test_no_metric_name_is_both_a_leaf_and_a_folder() -> None:
    # A tool named like an aggregate ("calls", "failure_rate") must not shadow it.
    trajectories = [
        make(i, tool_stats={name: (1, 0, 0.1)})
        for i, name in enumerate(["calls", "failure_rate", "used_fraction", "a/b", "ok"])
    ]
    names = set(rollout_metrics(trajectories))
    assert "tools/tool_failure_rate/calls" in names
    for name in names:
        parts = name.split("/")
        for cut in range(1, len(parts)):
            assert "/".join(parts[:cut]) not in names, name
    assert {f"rollout/status/{s}" for s in TERMINAL_STATUSES} <= names


def test_tool_timeouts_have_their_own_rate() -> None:
    base = make(0, tool_stats={"search": (4, 1, 0.4)})
    stats = {"search": {**base.metrics["tool_stats"]["search"], "timeouts": 1}}
    timed_out = dataclasses.replace(base, metrics={**base.metrics, "tool_stats": stats})
    m = rollout_metrics([timed_out, make(1, tool_stats={"search": (4, 0, 0.4)})])
    assert m["tools/search/timeout_rate"] == 1 / 8
    assert m["tools/search/failure_rate"] == 1 / 8  # a timeout is a failure too
    assert rollout_metrics([timed_out.to_row()]) == rollout_metrics([timed_out])
