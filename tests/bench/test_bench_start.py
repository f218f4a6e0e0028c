"""benchmarks/bench_start.py at a tiny size: every trajectory's first request reaches the
engine, and the figures it reports are there (the 1,024-prompt run is in the docs)."""

from __future__ import annotations

from benchmarks.bench_start import measure_start


def test_start_benchmark_runs_small() -> None:
    report = measure_start(trajectories=32, n=4, shared_prompt_words=20)
    assert report["trajectories"] == 32  # all 32 first requests arrived (it waits for them)
    assert 0 < report["first_request_s"] <= report["last_first_request_s"]
    assert report["prompt_tokens_mean"] > 20
    assert report["render_tokenizer_encode_s"] > 0 and report["render_encode_many_s"] > 0
    runner_only = measure_start(trajectories=8, n=4, shared_prompt_words=0, runner_only=True)
    assert set(runner_only) == {"trajectories", "first_request_s", "last_first_request_s"}
