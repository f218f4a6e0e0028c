"""Evaluation summaries computed from trajectories, checked against direct counting."""

from __future__ import annotations

import math
from dataclasses import replace
from itertools import product

import pytest
from tests._trajectories import make

from toolrollout import UserError
from toolrollout.apps.eval import compare, summarize
from toolrollout.rollout import Trajectory, TrajectoryStatus


def group(prompt: int, rewards: list[float | None], source: str | None = None) -> list[Trajectory]:
    out = []
    for sample, reward in enumerate(rewards):
        status = TrajectoryStatus.FAILED if reward is None else TrajectoryStatus.COMPLETED
        t = make(prompt, reward=reward, status=status, source=source, turns=1 + sample % 3)
        out.append(replace(t, sample_index=sample, uid=f"{t.group_id}-{sample}"))
    return out


def test_accuracy_and_pass_at_k_count_failed_samples_as_wrong() -> None:
    runs = (
        group(0, [1.0, 0.0, None, 0.0])
        + group(1, [0.0, 0.0, 0.0, 0.0])
        + group(2, [1.0, 1.0, 0.2, 0.9])
    )
    summary = summarize(runs, label="x", success_threshold=0.5)
    m = summary.metrics
    assert m["eval/problems"] == 3 and m["eval/samples_per_problem"] == 4
    assert m["eval/accuracy"] == pytest.approx(4 / 12)
    assert m["eval/pass_at_1"] == pytest.approx((1 / 4 + 0 + 3 / 4) / 3)
    # pass@2: 1 - C(n-c, 2)/C(4, 2) per problem
    expected = (1 - math.comb(3, 2) / 6 + 0 + 1 - math.comb(1, 2) / 6) / 3
    assert m["eval/pass_at_2"] == pytest.approx(expected)
    assert m["eval/pass_at_4"] == pytest.approx(2 / 3)
    assert "eval/pass_at_8" not in m
    assert m["eval/accuracy_ci_low"] <= m["eval/accuracy"] <= m["eval/accuracy_ci_high"]
    assert summary.problem_scores == {0: 0.25, 1: 0.0, 2: 0.75}
    # turns are 1, 2, 3, 1 within each group of four
    assert summary.turns_histogram == {1: 6, 2: 3, 3: 3}
    assert m["rollout/status/failed"] == pytest.approx(1 / 12)


def test_threshold_decides_what_counts_as_correct() -> None:
    runs = group(0, [0.9, 0.4])
    assert summarize(runs, success_threshold=0.5).metrics["eval/accuracy"] == 0.5
    assert summarize(runs, success_threshold=0.3).metrics["eval/accuracy"] == 1.0


def test_sources_are_split_only_when_the_run_mixes_them() -> None:
    mixed = group(0, [1.0, 1.0], "a") + group(1, [0.0, 1.0], "b") + group(2, [0.0, 0.0], "b")
    summary = summarize(mixed)
    assert set(summary.by_source) == {"a", "b"}
    assert summary.by_source["a"]["eval/accuracy"] == 1.0
    assert summary.by_source["b"]["eval/accuracy"] == 0.25
    assert summary.by_source["b"]["rollout/trajectories"] == 4
    flat = summary.flat_metrics(prefix="baseline")
    assert flat["baseline/by_source/b/eval/accuracy"] == 0.25
    assert flat["baseline/eval/accuracy"] == summary.metrics["eval/accuracy"]
    assert summarize(group(0, [1.0], "a") + group(1, [0.0], "a")).by_source == {}


def test_latency_split_and_tool_calls_per_tool() -> None:
    runs = [
        make(0, tool_stats={"calc": (2, 0, 0.2)}, generation=1.0, tools_s=0.5, total=2.0),
        make(1, generation=3.0, tools_s=0.0, total=3.5),
    ]
    summary = summarize(runs)
    assert summary.latency == pytest.approx({"generation": 2.0, "tools": 0.25, "other": 0.5})
    assert summary.tool_calls == {"calc": 1.0}


def test_compare_is_after_minus_before_and_paired_on_shared_problems() -> None:
    before = summarize(
        [t for p, r in product(range(6), [0.0]) for t in group(p, [r, 1.0 if p < 2 else 0.0])]
    )
    after = summarize([t for p in range(6) for t in group(p, [1.0, 1.0 if p < 4 else 0.0])])
    result = compare(before, after, seed=3)
    diff = result.accuracy_difference
    assert diff.paired
    direct = after.metrics["eval/accuracy"] - before.metrics["eval/accuracy"]
    assert diff.estimate == pytest.approx(direct)
    assert diff.low <= direct <= diff.high
    assert result.metrics()["compare/accuracy/diff"] == pytest.approx(direct)


def test_an_empty_run_is_a_user_error() -> None:
    with pytest.raises(UserError, match="no trajectories"):
        summarize([], label="empty")
