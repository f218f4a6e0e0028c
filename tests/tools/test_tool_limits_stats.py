"""Statistics: latency percentiles, retries, per-call fields and the per-trajectory summary."""

from __future__ import annotations

import dataclasses
import statistics

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolrollout._exceptions import (
    CircuitOpen,
    ToolArgumentError,
    ToolNotFound,
    ToolTimeout,
    ToolUnavailable,
    UserError,
)
from toolrollout.tools import (
    RetryPolicy,
    ToolCallRequest,
    ToolExecutor,
    ToolLimits,
    ToolResult,
    function_tool,
    summarize_tool_calls,
)
from toolrollout.tools._limits import LatencyWindow, quantile
from toolrollout.tools._summary import ToolCallSummary


class TestPercentiles:
    def test_known_values(self) -> None:
        window = LatencyWindow(size=1000)
        for value in range(1, 101):
            window.record(float(value))
        stats = window.statistics()
        assert stats.p50 == pytest.approx(50.5)
        assert stats.p95 == pytest.approx(95.05)
        assert (stats.max, stats.mean, stats.count, stats.window) == (100.0, 50.5, 100, 1000)

    def test_single_value_and_empty_window(self) -> None:
        window = LatencyWindow(size=4)
        empty = window.statistics()
        assert (empty.count, empty.p50, empty.p95, empty.max, empty.mean) == (
            0,
            None,
            None,
            None,
            None,
        )
        window.record(0.25)
        one = window.statistics()
        assert (one.p50, one.p95, one.max) == (0.25, 0.25, 0.25)

    def test_the_ring_buffer_keeps_only_the_most_recent(self) -> None:
        window = LatencyWindow(size=10)
        for value in [100.0] * 50 + [float(v) for v in range(1, 11)]:
            window.record(value)  # an old slow phase, then 10 fast calls
        stats = window.statistics()
        assert stats.count == 60 and stats.max == 10.0
        assert stats.p50 == pytest.approx(5.5) and stats.p95 == pytest.approx(9.55)

    @given(st.lists(st.floats(0, 1e3, allow_nan=False), min_size=2, max_size=200))
    def test_matches_the_inclusive_quantiles_of_the_standard_library(
        self, values: list[float]
    ) -> None:
        cuts = statistics.quantiles(values, n=100, method="inclusive")
        ordered = sorted(values)
        assert quantile(ordered, 0.50) == pytest.approx(cuts[49], rel=1e-9, abs=1e-9)
        assert quantile(ordered, 0.95) == pytest.approx(cuts[94], rel=1e-9, abs=1e-9)

    def test_bad_arguments(self) -> None:
        with pytest.raises(ValueError):
            quantile([], 0.5)
        with pytest.raises(ValueError):
            quantile([1.0], 1.5)
        with pytest.raises(UserError):
            LatencyWindow(size=0)
        with pytest.raises(UserError, match="latency_window"):
            ToolExecutor([], latency_window=0)


async def test_executor_latency_percentiles_follow_the_calls() -> None:
    @function_tool
    async def wait(seconds: float) -> str:
        await anyio.sleep(seconds)
        return "done"

    executor = ToolExecutor([wait])
    delays = [0.02 * i for i in range(1, 11)]  # 0.02 .. 0.20, run concurrently
    await executor.run_calls([ToolCallRequest("wait", {"seconds": d}) for d in delays])
    await executor.run_call(ToolCallRequest("wait", {"seconds": "soon"}))  # never ran
    stats = executor.statistics().tools["wait"]
    assert stats.calls == 11 and stats.latency.count == 10
    # exact percentiles of the delays: p50 0.11, p95 0.191; measured ones add overhead only
    assert stats.latency.p50 is not None and stats.latency.p95 is not None
    assert 0.11 <= stats.latency.p50 < 0.11 + 0.06
    assert 0.191 <= stats.latency.p95 < 0.191 + 0.06
    assert stats.latency.max is not None and 0.2 <= stats.latency.max < 0.26


async def test_retries_are_counted_per_result_and_per_tool() -> None:
    failures = {"flaky": 2, "down": 99}

    @function_tool(
        limits=ToolLimits(retry=RetryPolicy(max_attempts=4, initial_backoff=0.001, jitter=0.001))
    )
    async def service(name: str) -> str:
        if failures[name] > 0:
            failures[name] -= 1
            raise ToolUnavailable(f"{name} is restarting")
        return f"{name} ok"

    executor = ToolExecutor([service])
    flaky = await executor.run_call(ToolCallRequest("service", {"name": "flaky"}))
    assert (flaky.text, flaky.attempts, flaky.retries, flaky.is_error) == ("flaky ok", 3, 2, False)
    down = await executor.run_call(ToolCallRequest("service", {"name": "down"}))
    assert (down.error_kind, down.attempts, down.retries) == ("ToolUnavailable", 4, 3)
    stats = executor.statistics().tools["service"]
    assert (stats.retries, stats.calls, stats.errors) == (5, 2, 1)


async def test_timeouts_retried_when_asked_count_once_per_call() -> None:
    policy = RetryPolicy(max_attempts=2, initial_backoff=0.001, jitter=0.001, retry_timeouts=True)

    @function_tool(limits=ToolLimits(timeout=0.05, retry=policy))
    async def hang() -> str:
        await anyio.sleep(10)
        return "never"

    executor = ToolExecutor([hang])
    result = await executor.run_call(ToolCallRequest("hang", {}))
    assert (result.error_kind, result.attempts) == ("ToolTimeout", 2)
    stats = executor.statistics().tools["hang"]
    assert (stats.timeouts, stats.retries, stats.errors) == (1, 1, 1)
    assert stats.cancelled == 0  # a timeout is the executor's own cancel: a result, counted


async def test_in_flight_and_running_are_visible_during_a_call() -> None:
    release = anyio.Event()

    @function_tool(limits=ToolLimits(max_concurrency=1))
    async def block() -> str:
        await release.wait()
        return "ok"

    executor = ToolExecutor([block])
    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(executor.run_call, ToolCallRequest("block", {}))
        await anyio.sleep(0.05)
        stats = executor.statistics().tools["block"]
        assert (stats.in_flight, stats.running, stats.limiter.tasks_waiting) == (3, 1, 2)
        release.set()
    final = executor.statistics().tools["block"]
    assert (final.in_flight, final.running, final.calls) == (0, 0, 3)


async def test_calls_cancelled_by_their_caller_are_counted_apart() -> None:
    """A cancelled call (running, or waiting for a slot) has no result: it is counted in
    ``cancelled``, not in ``calls``, ``errors`` or the latency window."""
    started = anyio.Event()

    @function_tool(limits=ToolLimits(max_concurrency=1))
    async def slow() -> str:
        started.set()
        await anyio.sleep(10)
        return "never"

    executor = ToolExecutor([slow])
    with anyio.move_on_after(5):  # the test's own guard
        async with anyio.create_task_group() as tg:
            for _ in range(2):  # one runs, one waits for the slot
                tg.start_soon(executor.run_call, ToolCallRequest("slow", {}))
            await started.wait()
            tg.cancel_scope.cancel()
    stats = executor.statistics().tools["slow"]
    assert (stats.cancelled, stats.calls, stats.errors, stats.in_flight) == (2, 0, 0, 0)
    assert stats.latency.count == 0


def test_statistics_are_frozen_snapshots() -> None:
    stats = ToolExecutor([]).statistics()
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.unknown_tool_calls = 3  # type: ignore[misc]
    window = LatencyWindow()
    snapshot = window.statistics()
    window.record(1.0)
    assert snapshot.count == 0  # a snapshot does not move


async def test_results_carry_attempts_zero_when_the_tool_never_ran() -> None:
    @function_tool
    async def square(x: int) -> int:
        return x * x

    executor = ToolExecutor([square])
    ok, bad, unknown = await executor.run_calls(
        [
            ToolCallRequest("square", {"x": 3}),
            ToolCallRequest("square", {"x": "three"}),
            ToolCallRequest("cube", {"x": 3}),
        ]
    )
    assert (ok.attempts, ok.retries, ok.error_kind) == (1, 0, None)
    assert (bad.attempts, bad.error_kind) == (0, "ToolArgumentError")
    assert (unknown.attempts, unknown.error_kind) == (0, "ToolNotFound")
    assert all(r.seconds >= 0 for r in (ok, bad, unknown))


def test_summarize_tool_calls_per_tool() -> None:
    def result(seconds: float, attempts: int = 1, **kw: object) -> ToolResult:
        return ToolResult(text="x", seconds=seconds, attempts=attempts, **kw)  # type: ignore[arg-type]

    records = [
        ("search", result(0.5)),
        ("search", result(2.0, attempts=3)),
        ("search", result(1.0, is_error=True, error=ToolTimeout("slow"))),
        ("search", result(0.0, 0, is_error=True, error=CircuitOpen("o", tool="s", retry_after=1))),
        ("calculator", result(0.01, is_error=True)),  # the tool wrote the error itself
        ("calculator", result(0.0, 0, is_error=True, error=ToolArgumentError("bad"))),
        ("nope", result(0.0, 0, is_error=True, error=ToolNotFound("unknown"))),
    ]
    summary = summarize_tool_calls(records)
    assert summary["search"] == ToolCallSummary(
        calls=4,
        errors=2,
        retries=2,
        timeouts=1,
        circuit_open=1,
        seconds=3.5,
        max_seconds=2.0,
        error_kinds={"ToolTimeout": 1, "CircuitOpen": 1},
    )
    assert summary["calculator"].to_dict() == {
        "calls": 2,
        "errors": 2,
        "retries": 0,
        "timeouts": 0,
        "circuit_open": 0,
        "seconds": 0.01,
        "max_seconds": 0.01,
        "error_kinds": {"ToolArgumentError": 1, "ToolReportedError": 1},
    }
    assert summary["nope"].error_kinds == {"ToolNotFound": 1}
    assert summarize_tool_calls([]) == {}
