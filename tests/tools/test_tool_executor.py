"""ToolExecutor: concurrency, timeouts, error translation, limits, retries, statistics."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolrollout._exceptions import (
    ToolArgumentError,
    ToolExecutionError,
    ToolNotFound,
    ToolTimeout,
    ToolUnavailable,
    UserError,
)
from toolrollout.tools import (
    FunctionTool,
    RetryPolicy,
    Tool,
    ToolCallRequest,
    ToolContext,
    ToolExecutor,
    ToolLimits,
    ToolResult,
    function_tool,
)

SLEEP = 0.2
N = 8


@function_tool
async def async_sleeper(tag: str) -> str:
    await anyio.sleep(SLEEP)
    return tag


@function_tool
def sync_sleeper(tag: str) -> str:
    time.sleep(SLEEP)
    return tag


@pytest.mark.parametrize("tool", [async_sleeper, sync_sleeper], ids=["async", "sync"])
async def test_one_turn_runs_concurrently(tool: FunctionTool[Any, Any]) -> None:
    executor = ToolExecutor([tool])
    calls = [ToolCallRequest(tool.name, {"tag": str(i)}) for i in range(N)]
    started = time.perf_counter()
    results = await executor.run_calls(calls)
    elapsed = time.perf_counter() - started
    assert [r.text for r in results] == [str(i) for i in range(N)]
    assert elapsed < N * SLEEP / 2, f"{N} calls took {elapsed:.2f}s: not concurrent"
    assert all(r.seconds >= SLEEP * 0.9 for r in results)


async def test_results_keep_call_order_when_finishing_out_of_order() -> None:
    @function_tool
    async def wait(delay: float) -> float:
        await anyio.sleep(delay)
        return delay

    executor = ToolExecutor([wait])
    delays = [0.15, 0.0, 0.1, 0.05]
    results = await executor.run_calls([ToolCallRequest("wait", {"delay": d}) for d in delays])
    assert [float(r.text) for r in results] == delays


async def test_timeout_really_cancels_the_call() -> None:
    finished = anyio.Event()
    cancelled = anyio.Event()

    @function_tool(limits=ToolLimits(timeout=0.1))
    async def hang() -> str:
        try:
            await anyio.sleep(30)
            finished.set()
            return "never"
        finally:
            cancelled.set()

    executor = ToolExecutor([hang])
    started = time.perf_counter()
    [result] = await executor.run_calls([ToolCallRequest("hang", {})])
    assert time.perf_counter() - started < 5
    assert cancelled.is_set() and not finished.is_set()
    assert result.is_error
    assert result.text == "Error: tool 'hang' timed out after 0.1s"
    assert isinstance(result.error, ToolTimeout) and result.error_kind == "ToolTimeout"
    stats = executor.statistics().tools["hang"]
    assert (stats.calls, stats.errors, stats.timeouts, stats.in_flight) == (1, 1, 1, 0)


async def test_unknown_tool_is_an_error_result_listing_available_tools() -> None:
    executor = ToolExecutor([async_sleeper, sync_sleeper])
    [result] = await executor.run_calls([ToolCallRequest("nope", {})])
    assert result.is_error
    assert result.text == "Error: unknown tool 'nope'; available: async_sleeper, sync_sleeper"
    assert isinstance(result.error, ToolNotFound)
    stats = executor.statistics()
    assert stats.unknown_tool_calls == 1 and stats.errors == 1 and stats.calls == 1


async def test_tool_exception_is_translated_recorded_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    @function_tool
    def bad(x: int) -> int:
        raise ValueError(f"cannot handle {x}")

    executor = ToolExecutor([bad])
    with caplog.at_level(logging.WARNING, logger="toolrollout.tools._executor"):
        [result] = await executor.run_calls([ToolCallRequest("bad", {"x": 3})])
    assert result.is_error
    assert result.text == "Error: tool 'bad' raised ValueError: cannot handle 3"
    assert isinstance(result.error, ToolExecutionError)
    assert isinstance(result.error.__cause__, ValueError)
    assert any("cannot handle 3" in record.getMessage() for record in caplog.records)
    assert executor.statistics().tools["bad"].errors == 1


async def test_argument_errors_are_results_and_do_not_run_the_tool() -> None:
    ran: list[int] = []

    @function_tool
    def square(x: int) -> int:
        ran.append(x)
        return x * x

    executor = ToolExecutor([square])
    results = await executor.run_calls(
        [
            ToolCallRequest("square", {"x": "seven"}),
            ToolCallRequest("square", '{"x": '),
            ToolCallRequest("square", "[1, 2]"),
            ToolCallRequest("square", '{"x": 4}'),
        ]
    )
    assert [r.is_error for r in results] == [True, True, True, False]
    assert "'x'" in results[0].text and "(got 'seven')" in results[0].text
    assert "not valid JSON" in results[1].text
    assert "expected a JSON object" in results[2].text
    assert all(isinstance(r.error, ToolArgumentError) for r in results[:3])
    assert results[3].text == "16" and ran == [4]
    stats = executor.statistics().tools["square"]
    assert (stats.invalid_arguments, stats.errors, stats.calls) == (3, 3, 4)


async def test_per_tool_concurrency_limit_is_respected() -> None:
    running = 0
    peak = 0

    @function_tool(limits=ToolLimits(max_concurrency=2))
    async def limited() -> str:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await anyio.sleep(0.05)
        running -= 1
        return "ok"

    @function_tool
    async def free() -> str:
        nonlocal running, peak
        await anyio.sleep(0.05)
        return "ok"

    executor = ToolExecutor([limited, free])
    started = time.perf_counter()
    calls = [ToolCallRequest("limited", {}) for _ in range(6)]
    results = await executor.run_calls(calls + [ToolCallRequest("free", {}) for _ in range(6)])
    assert all(not r.is_error for r in results)
    assert peak == 2
    assert time.perf_counter() - started >= 3 * 0.05 * 0.9
    stats = executor.statistics().tools
    assert stats["limited"].max_running == 2
    assert stats["limited"].limiter.total_tokens == 2
    assert stats["free"].max_running == 6  # the other tool's limit does not apply to it


async def test_rate_limit_spaces_call_starts() -> None:
    starts: list[float] = []

    @function_tool(limits=ToolLimits(rate_limit=10))
    async def ping() -> str:
        starts.append(time.perf_counter())
        return "pong"

    executor = ToolExecutor([ping])
    await executor.run_calls([ToolCallRequest("ping", {}) for _ in range(5)])
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert len(starts) == 5
    assert starts[-1] - starts[0] >= 4 * 0.1 * 0.8, gaps
    rate = executor.statistics().tools["ping"].rate_limiter
    assert rate is not None and rate.acquired == 5 and rate.rate == 10


async def test_infrastructure_errors_are_retried_then_succeed() -> None:
    attempts = 0

    @function_tool(
        limits=ToolLimits(retry=RetryPolicy(max_attempts=4, initial_backoff=0.001, jitter=0.001))
    )
    async def flaky() -> str:
        nonlocal attempts
        attempts += 1
        if attempts < 3:
            raise ToolUnavailable("backend restarting")
        return "up"

    executor = ToolExecutor([flaky])
    [result] = await executor.run_calls([ToolCallRequest("flaky", {})])
    assert result.text == "up" and not result.is_error
    assert attempts == 3
    assert executor.statistics().tools["flaky"].retries == 2


async def test_retries_exhausted_gives_unavailable_with_cause() -> None:
    attempts = 0

    @function_tool(
        limits=ToolLimits(retry=RetryPolicy(max_attempts=3, initial_backoff=0.001, jitter=0.001))
    )
    def down() -> str:
        nonlocal attempts
        attempts += 1
        raise ConnectionRefusedError("connection refused")

    executor = ToolExecutor([down])
    [result] = await executor.run_calls([ToolCallRequest("down", {})])
    assert attempts == 3
    assert isinstance(result.error, ToolUnavailable)
    assert isinstance(result.error.__cause__, ConnectionRefusedError)
    assert result.text == (
        "Error: tool 'down' is unavailable: ConnectionRefusedError: connection refused"
    )


async def test_tool_errors_are_not_retried() -> None:
    attempts = 0

    @function_tool(
        limits=ToolLimits(retry=RetryPolicy(max_attempts=6, initial_backoff=0.001, jitter=0.001))
    )
    def wrong() -> str:
        nonlocal attempts
        attempts += 1
        raise KeyError("missing")

    [result] = await ToolExecutor([wrong]).run_calls([ToolCallRequest("wrong", {})])
    assert attempts == 1 and result.error_kind == "ToolExecutionError"


async def test_outer_cancellation_propagates_and_cleans_up() -> None:
    cleaned = anyio.Event()

    @function_tool(limits=ToolLimits(timeout=None))
    async def forever() -> str:
        try:
            await anyio.sleep(30)
        finally:
            cleaned.set()
        return "never"

    executor = ToolExecutor([forever])
    with anyio.move_on_after(0.1) as scope:
        await executor.run_calls([ToolCallRequest("forever", {}) for _ in range(3)])
    assert scope.cancelled_caught
    assert cleaned.is_set()
    stats = executor.statistics().tools["forever"]
    assert (stats.in_flight, stats.running, stats.calls, stats.errors) == (0, 0, 0, 0)


@dataclass(frozen=True, kw_only=True)
class EchoTool(Tool):
    """A hand-written Tool subclass (no function behind it)."""

    async def call(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        return ToolResult(text=f"{context.trajectory_id}:{arguments['word']}")


async def test_custom_tool_subclass_context_and_required_check() -> None:
    echo = EchoTool(
        name="echo",
        parameters={"type": "object", "properties": {"word": {}}, "required": ["word"]},
    )
    executor = ToolExecutor([echo])
    results = await executor.run_calls(
        [ToolCallRequest("echo", {"word": "hi"}), ToolCallRequest("echo", {})],
        ToolContext(trajectory_id="traj-7"),
    )
    assert results[0].text == "traj-7:hi"
    assert results[1].is_error and "missing required argument(s) 'word'" in results[1].text
    assert executor.schemas() == [echo.schema()]


def test_executor_rejects_duplicates_and_unknown_limit_names() -> None:
    with pytest.raises(UserError, match="two tools are named 'async_sleeper'"):
        ToolExecutor([async_sleeper, async_sleeper])
    with pytest.raises(UserError, match="unknown tool 'x'"):
        ToolExecutor([async_sleeper], limits={"x": ToolLimits()})
    executor = ToolExecutor([async_sleeper], limits={"async_sleeper": ToolLimits(timeout=1)})
    assert executor.tools["async_sleeper"].limits.timeout == 1


def test_limits_are_validated() -> None:
    with pytest.raises(UserError, match="timeout"):
        ToolLimits(timeout=0)
    with pytest.raises(UserError, match="max_concurrency"):
        ToolLimits(max_concurrency=0)
    with pytest.raises(UserError, match="rate_limit"):
        ToolLimits(rate_limit=-1)
    with pytest.raises(UserError, match="max_attempts"):
        RetryPolicy(max_attempts=0)


async def test_timeout_of_a_sync_tool_returns_on_time() -> None:
    # A thread cannot be interrupted: the executor stops waiting, the thread ends by itself.
    # The thread is held until after the result is back, so "on time" needs no stopwatch.
    release, finished = threading.Event(), threading.Event()

    @function_tool(limits=ToolLimits(timeout=0.05))
    def slow_sync() -> str:
        release.wait(60)
        finished.set()
        return "late"

    try:
        [result] = await ToolExecutor([slow_sync]).run_calls([ToolCallRequest("slow_sync", {})])
        assert not finished.is_set(), "the result waited for the thread"
    finally:
        release.set()
    assert result.error_kind == "ToolTimeout"
    assert result.text == "Error: tool 'slow_sync' timed out after 0.05s"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
)


@settings(max_examples=60, deadline=None)
@given(
    calls=st.lists(
        st.tuples(
            st.sampled_from(["square", "missing"]),
            st.one_of(st.dictionaries(st.text(max_size=5), json_values), st.text(max_size=12)),
        ),
        max_size=5,
    )
)
def test_any_arguments_give_one_result_per_call_and_never_raise(
    calls: list[tuple[str, Any]],
) -> None:
    @function_tool
    async def square(x: int) -> int:
        return x * x

    executor = ToolExecutor([square])
    requests = [ToolCallRequest(name, args) for name, args in calls]
    results = anyio.run(executor.run_calls, requests)
    assert len(results) == len(requests)
    for request, result in zip(requests, results, strict=True):
        if result.is_error:
            assert result.error is not None and result.text.startswith("Error: ")
        else:
            assert request.name == "square"
    stats = executor.statistics()
    assert stats.calls == len(requests)
    assert stats.errors == sum(r.is_error for r in results)
