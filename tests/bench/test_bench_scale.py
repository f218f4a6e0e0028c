"""benchmarks/bench_scale.py at a tiny size: it runs, every trajectory completes, and the
figures it reports are there and consistent (the 10,000-trajectory run is in the docs)."""

from __future__ import annotations

import gc
from typing import Any

import pytest
from benchmarks.bench_inflight_memory import split
from benchmarks.bench_scale import ScaleConfig, memory_model, run_scale


def test_scale_benchmark_runs_small() -> None:
    config = ScaleConfig(
        trajectories=24, turns=3, tokens=32, turn_seconds=0.05, tool_seconds=0.01, sample_every=0.05
    )
    report = run_scale(config)  # the demo tokenizer
    assert report["statuses"] == {"completed": 24}
    assert report["turns"] == 24 * 3
    storage = report["token_storage"]
    assert storage["tokens"] > 24 * 3 * 32
    # Arrays: a few bytes a token; the tuples of before: tens.
    assert storage["live_bytes_per_token"] < storage["before_bytes_per_token"] / 3
    assert report["lag_ms"]["samples"] > 0
    assert report["lag_ms"]["p50"] <= report["lag_ms"]["p99"] <= report["lag_ms"]["max"]
    assert report["ticks"] and report["peak_rss_mb"] > 0


def _small(**options: Any) -> ScaleConfig:
    """12 short trajectories; ``options`` override any field."""
    fields: dict[str, Any] = {
        "trajectories": 12,
        "turns": 2,
        "tokens": 32,
        "turn_seconds": 0.05,
        "tool_seconds": 0.01,
        "sample_every": 0.05,
    }
    return ScaleConfig(**{**fields, **options})


def test_the_breakdown_names_toolrollouts_allocation_sites() -> None:
    report = run_scale(_small(turn_seconds=0.2, breakdown=True))
    breakdown = report["breakdown"]
    sites = breakdown["by_site_bytes_per_held_token"]
    assert breakdown["live_tokens"] > 0 and breakdown["traced_bytes_per_held_token"] > 0
    # The token arrays are allocated in the records module: it is among the named sites.
    assert any(site.startswith("toolrollout/_records/") for site in sites)
    assert sum(sites.values()) <= breakdown["traced_bytes_per_held_token"] + 1e-9
    # Grouped into the parts docs/benchmarks.md tabulates: every traced byte in one part,
    # the token arrays and the trajectories' tasks among them.
    parts = breakdown["by_part_bytes_per_held_token"]
    assert sum(parts.values()) == pytest.approx(breakdown["traced_bytes_per_held_token"])
    assert parts["token storage (ids, float32 logprobs)"] > 0
    assert parts["the trajectory's task, task group entry and deadline"] > 0


def test_collections_are_recorded_and_the_collector_is_left_as_it_was() -> None:
    """Every garbage collection of the run is reported by generation (with its share of the
    longest stalls); ``freeze`` and ``off`` are the run's own and are undone after it."""
    default = run_scale(_small())
    rows = default["gc"]["by_generation"]
    assert rows and sum(row["count"] for row in rows.values()) > 0
    assert all(row["cpu_s"] <= row["total_s"] + 0.05 for row in rows.values())
    assert len(default["gc"]["longest_stalls"]) == min(10, default["lag_ms"]["samples"])
    frozen = run_scale(_small(gc_mode="freeze"))
    assert frozen["config"]["gc_frozen_objects"] > 10_000  # the imported libraries at least
    off = run_scale(_small(gc_mode="off"))
    assert off["gc"]["by_generation"] == {}
    assert gc.isenabled() and gc.get_freeze_count() == 0


def _tick(live: int, finished: int, tokens: int, rss: float) -> dict[str, float]:
    return {
        "live_trajectories": live,
        "finished": finished,
        "live_tokens": tokens,
        "held_tokens": tokens,
        "rss_added": rss,
    }


def test_the_memory_model_splits_tokens_from_trajectories() -> None:
    # 100 trajectories of 5,000 bytes each and 12 bytes a token, plus ramp-up and ending
    # samples that must not enter the fit
    steady = [_tick(100, 0, n, 100 * 5_000 + 12 * n) for n in (10_000, 20_000, 40_000, 50_000)]
    ramp = [_tick(40, 0, 2_000, 10**9), _tick(60, 40, 60_000, 100 * 5_000 + 12 * 60_000)]
    model = memory_model([ramp[0], *steady, ramp[1]], 100)
    assert model is not None and model["samples"] == 4
    assert abs(model["bytes_per_held_token_at_the_margin"] - 12) < 1e-9
    assert abs(model["fixed_bytes_per_trajectory"] - 5_000) < 1e-6
    assert model["held_tokens_per_trajectory_at_the_peak"] == 600
    assert memory_model(steady[:2], 100) is None  # too few samples to fit


def test_the_inflight_split_fits_per_request_and_per_token() -> None:
    runs = [
        {
            "prompt_tokens": n,
            "held_bytes_per_request": 30_000 + 7 * n,
            "json_body_bytes_per_prompt_token": 6.4,
        }
        for n in (500, 2_000, 8_000)
    ]
    fit = split(runs)
    assert abs(fit["bytes_per_prompt_token_at_the_margin"] - 7) < 1e-9
    assert abs(fit["bytes_per_request"] - 30_000) < 1e-6
