"""Circuit breaker: the state machine on a fake clock, then wired into the executor."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from toolrollout._exceptions import (
    CircuitOpen,
    ToolArgumentError,
    ToolExecutionError,
    ToolNotFound,
    ToolTimeout,
    ToolUnavailable,
    UserError,
)
from toolrollout.tools import (
    CircuitBreakerPolicy,
    RetryPolicy,
    ToolCallRequest,
    ToolExecutor,
    ToolLimits,
    ToolResult,
    function_tool,
)
from toolrollout.tools._limits import CircuitBreaker, CircuitState


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def breaker(threshold: int = 3, reset: float = 10.0) -> tuple[CircuitBreaker, FakeClock]:
    clock = FakeClock()
    policy = CircuitBreakerPolicy(failure_threshold=threshold, reset_timeout=reset)
    return CircuitBreaker("search", policy, clock=clock), clock


def state(cb: CircuitBreaker) -> CircuitState:
    """The state, read through a call (so the type checker does not narrow it)."""
    return cb.state


DOWN = ToolUnavailable("tool 'search' is unavailable: ConnectionRefusedError")


class TestStateMachine:
    def test_opens_after_n_consecutive_failures_and_fails_fast(self) -> None:
        cb, _ = breaker(threshold=3)
        for _ in range(2):
            cb.record(cb.acquire(), DOWN)
        assert state(cb) is CircuitState.CLOSED
        cb.record(cb.acquire(), DOWN)
        assert state(cb) is CircuitState.OPEN
        with pytest.raises(CircuitOpen) as info:
            cb.acquire()
        assert "circuit breaker open after 3 consecutive failures" in str(info.value)
        assert "tool 'search'" in str(info.value) and "ToolUnavailable" in str(info.value)
        assert info.value.tool == "search" and info.value.retry_after == pytest.approx(10.0)
        stats = cb.statistics()
        assert (stats.state, stats.open_count, stats.rejected_calls) == ("open", 1, 1)
        assert stats.consecutive_failures == 3 and stats.retry_after == pytest.approx(10.0)

    def test_a_success_resets_the_consecutive_count(self) -> None:
        cb, _ = breaker(threshold=3)
        for _ in range(5):
            cb.record(cb.acquire(), DOWN)
            cb.record(cb.acquire(), DOWN)
            cb.record(cb.acquire(), None)
        assert state(cb) is CircuitState.CLOSED and cb.statistics().open_count == 0

    def test_half_opens_after_reset_timeout_and_closes_on_a_successful_trial(self) -> None:
        cb, clock = breaker(threshold=1, reset=10.0)
        cb.record(cb.acquire(), DOWN)
        clock.now += 9.9
        with pytest.raises(CircuitOpen):
            cb.acquire()
        clock.now += 0.1
        assert state(cb) is CircuitState.HALF_OPEN
        trial = cb.acquire()
        with pytest.raises(CircuitOpen, match="trial call is in flight") as info:
            cb.acquire()  # one trial at a time
        assert info.value.retry_after == 0.0
        cb.record(trial, None)
        assert state(cb) is CircuitState.CLOSED
        assert cb.statistics().consecutive_failures == 0
        cb.acquire()  # closed: calls go through again

    def test_a_failed_trial_opens_it_again_for_another_reset_timeout(self) -> None:
        cb, clock = breaker(threshold=2, reset=10.0)
        cb.record(cb.acquire(), DOWN)
        cb.record(cb.acquire(), DOWN)
        clock.now += 10
        cb.record(cb.acquire(), ToolTimeout("tool 'search' timed out after 5s"))
        stats = cb.statistics()
        assert stats.state is CircuitState.OPEN and stats.open_count == 2
        assert stats.retry_after == pytest.approx(10.0)
        assert stats.last_failure == "ToolTimeout: tool 'search' timed out after 5s"
        clock.now += 10
        assert state(cb) is CircuitState.HALF_OPEN

    def test_a_released_trial_lets_the_next_call_be_the_trial(self) -> None:
        cb, clock = breaker(threshold=1)
        cb.record(cb.acquire(), DOWN)
        clock.now += 10
        cb.release(cb.acquire())  # cancelled: says nothing about the backend
        cb.record(cb.acquire(), ToolArgumentError("bad"))  # neutral: freed too
        cb.record(cb.acquire(), None)
        assert state(cb) is CircuitState.CLOSED

    @pytest.mark.parametrize(
        "error",
        [
            ToolArgumentError("invalid arguments"),
            ToolNotFound("unknown tool"),
            CircuitOpen("open", tool="search", retry_after=1.0),
            UserError("misconfigured"),
        ],
        ids=lambda e: type(e).__name__,
    )
    def test_model_mistakes_and_fail_fasts_never_count(self, error: Exception) -> None:
        cb, _ = breaker(threshold=1)
        assert not cb.counts(error)
        for _ in range(5):
            cb.record(cb.acquire(), error)
        assert state(cb) is CircuitState.CLOSED

    def test_outcomes_of_calls_admitted_before_the_breaker_opened_are_ignored(self) -> None:
        cb, _ = breaker(threshold=2)
        early = cb.acquire()
        cb.record(cb.acquire(), DOWN)
        cb.record(cb.acquire(), DOWN)
        cb.record(early, None)  # a slow call that succeeded after the outage began
        assert state(cb) is CircuitState.OPEN
        with pytest.raises(CircuitOpen):
            cb.check(early)  # and it may not retry either

    def test_trip_on_narrows_what_counts(self) -> None:
        policy = CircuitBreakerPolicy(failure_threshold=1, trip_on=(ToolTimeout,))
        cb = CircuitBreaker("t", policy)
        cb.record(cb.acquire(), ToolExecutionError("raised"))
        cb.record(cb.acquire(), DOWN)
        assert state(cb) is CircuitState.CLOSED
        cb.record(cb.acquire(), ToolTimeout("slow"))
        assert state(cb) is CircuitState.OPEN

    def test_policy_is_validated(self) -> None:
        with pytest.raises(UserError, match="failure_threshold"):
            CircuitBreakerPolicy(failure_threshold=0)
        with pytest.raises(UserError, match="reset_timeout"):
            CircuitBreakerPolicy(reset_timeout=0)
        with pytest.raises(UserError, match="model's mistakes never trip"):
            CircuitBreakerPolicy(trip_on=(ToolArgumentError,))  # type: ignore[arg-type]


RESET = 0.3


class Backend:
    """A tool backend that can be taken down and brought back, and held mid-call."""

    def __init__(self) -> None:
        self.up = False
        self.calls = 0
        self.entered = anyio.Event()
        """Set when a call reaches the backend while :attr:`hold` is set."""
        self.hold: anyio.Event | None = None
        """While set, calls wait for it before answering."""


def backend_tool(backend: Backend, **limits: Any) -> Any:
    policy = CircuitBreakerPolicy(failure_threshold=3, reset_timeout=RESET)
    defaults: dict[str, Any] = {"retry": RetryPolicy(max_attempts=1), "circuit_breaker": policy}

    @function_tool(limits=ToolLimits(**(defaults | limits)))
    async def search(query: str) -> str:
        backend.calls += 1
        if backend.hold is not None:
            backend.entered.set()
            await backend.hold.wait()
        if not backend.up:
            raise ConnectionRefusedError("connection refused")
        return f"results for {query}"

    return search


def call(query: Any = "q") -> ToolCallRequest:
    return ToolCallRequest("search", {"query": query})


class TestExecutor:
    """The executor's breakers read a fake clock: the reset timeout passes when told to."""

    async def test_opens_after_n_failures_and_fails_fast_without_calling_the_tool(
        self,
    ) -> None:
        backend = Backend()
        executor = ToolExecutor([backend_tool(backend)], clock=FakeClock())
        for _ in range(3):
            result = await executor.run_call(call())
            assert result.error_kind == "ToolUnavailable" and result.attempts == 1
        assert backend.calls == 3

        result = await executor.run_call(call())
        assert backend.calls == 3, "an open breaker must not call the tool"
        assert result.is_error and result.error_kind == "CircuitOpen" and result.attempts == 0
        assert isinstance(result.error, ToolUnavailable)  # CircuitOpen is a ToolUnavailable
        assert result.text.startswith(
            "Error: tool 'search' is unavailable: circuit breaker open after 3 consecutive "
            "failures (last: ToolUnavailable: tool 'search' is unavailable: "
            "ConnectionRefusedError: connection refused); failing fast for another 0.3s"
        )
        stats = executor.statistics().tools["search"]
        assert stats.circuit_breaker is not None
        assert stats.circuit_breaker.state is CircuitState.OPEN
        assert (stats.circuit_breaker.open_count, stats.circuit_breaker.rejected_calls) == (1, 1)
        assert (stats.calls, stats.errors) == (4, 4)
        assert stats.latency.count == 3, "fail-fast calls are not latency samples"

    async def test_half_opens_after_reset_timeout_and_closes_on_success(self) -> None:
        backend, clock = Backend(), FakeClock()
        executor = ToolExecutor([backend_tool(backend)], clock=clock)
        for _ in range(3):
            await executor.run_call(call())
        backend.up = True
        assert (await executor.run_call(call())).error_kind == "CircuitOpen"
        clock.now += RESET
        assert executor.statistics().tools["search"].circuit_breaker.state == "half_open"  # type: ignore[union-attr]

        backend.hold = anyio.Event()  # the trial is in flight while a second call arrives
        results: dict[str, ToolResult] = {}

        async def run(query: str) -> None:
            results[query] = await executor.run_call(call(query))

        async with anyio.create_task_group() as tg:
            tg.start_soon(run, "a")
            await backend.entered.wait()
            await run("b")
            backend.hold.set()
        trial, rejected = results["a"], results["b"]
        assert trial.text == "results for a" and not trial.is_error
        assert rejected.error_kind == "CircuitOpen" and "trial call is in flight" in rejected.text
        assert backend.calls == 4
        breaker_stats = executor.statistics().tools["search"].circuit_breaker
        assert breaker_stats is not None and breaker_stats.state is CircuitState.CLOSED
        backend.hold = None
        assert (await executor.run_call(call())).text == "results for q"

    async def test_a_failed_trial_opens_it_again(self) -> None:
        backend, clock = Backend(), FakeClock()
        executor = ToolExecutor([backend_tool(backend)], clock=clock)
        for _ in range(3):
            await executor.run_call(call())
        clock.now += RESET
        assert (await executor.run_call(call())).error_kind == "ToolUnavailable"  # the trial
        assert (await executor.run_call(call())).error_kind == "CircuitOpen"
        stats = executor.statistics().tools["search"].circuit_breaker
        assert stats is not None and stats.open_count == 2 and backend.calls == 4

    async def test_a_cancelled_trial_does_not_wedge_the_breaker_half_open(self) -> None:
        backend, clock = Backend(), FakeClock()
        executor = ToolExecutor([backend_tool(backend)], clock=clock)
        for _ in range(3):
            await executor.run_call(call())
        clock.now += RESET
        backend.up, backend.hold = True, anyio.Event()  # never set: the trial hangs
        async with anyio.create_task_group() as tg:
            tg.start_soon(executor.run_call, call())
            await backend.entered.wait()
            tg.cancel_scope.cancel()  # cancelled while in flight
        backend.hold = None
        result = await executor.run_call(call())
        assert result.text == "results for q", result.text

    async def test_model_errors_do_not_trip_it(self) -> None:
        backend = Backend()
        backend.up = True
        policy = CircuitBreakerPolicy(failure_threshold=1, reset_timeout=60)

        @function_tool(limits=ToolLimits(circuit_breaker=policy))
        async def strict(n: int) -> str:
            if n < 0:
                raise ToolArgumentError("n must be >= 0")  # the tool blames the input
            return "ok"

        @function_tool(limits=ToolLimits(circuit_breaker=policy))
        async def grumpy() -> ToolResult:
            return ToolResult(text="Error: no results", is_error=True)  # answered: a success

        executor = ToolExecutor([strict, grumpy, backend_tool(backend, circuit_breaker=policy)])
        for _ in range(3):
            results = await executor.run_calls(
                [
                    ToolCallRequest("strict", {"n": "x"}),  # fails the schema
                    ToolCallRequest("strict", "{not json"),
                    ToolCallRequest("strict", {"n": -1}),  # raised by the tool
                    ToolCallRequest("nope", {}),  # unknown tool
                    ToolCallRequest("search", {}),  # missing argument
                    ToolCallRequest("grumpy", {}),
                ]
            )
            assert all(r.is_error for r in results)
            assert {r.error_kind for r in results} == {"ToolArgumentError", "ToolNotFound", None}
        assert [
            r.text for r in await executor.run_calls([call(), ToolCallRequest("strict", {"n": 1})])
        ] == [
            "results for q",
            "ok",
        ]
        for stats in executor.statistics().tools.values():
            assert stats.circuit_breaker is not None
            assert stats.circuit_breaker.state is CircuitState.CLOSED
            assert stats.circuit_breaker.open_count == 0

    async def test_fail_fast_is_never_retried(self) -> None:
        # CircuitOpen is a ToolUnavailable, which the retry policy retries: not this one.
        policy = CircuitBreakerPolicy(failure_threshold=2, reset_timeout=60)
        # a retry would hang
        retry = RetryPolicy(max_attempts=6, initial_backoff=60, max_backoff=60, jitter=60)
        ran = 0

        @function_tool(limits=ToolLimits(retry=retry, circuit_breaker=policy))
        def broken() -> str:
            nonlocal ran
            ran += 1
            raise KeyError("missing")  # ToolExecutionError: counted, not retried

        executor = ToolExecutor([broken])
        for _ in range(2):
            assert (await executor.run_call(ToolCallRequest("broken", {}))).attempts == 1
        with anyio.fail_after(30):  # generous: only a 60 s backoff could reach it
            result = await executor.run_call(ToolCallRequest("broken", {}))
        assert result.error_kind == "CircuitOpen" and result.attempts == 0 and ran == 2
        assert executor.statistics().tools["broken"].retries == 0

    async def test_a_retrying_call_stops_when_the_breaker_opens_meanwhile(self) -> None:
        policy = CircuitBreakerPolicy(failure_threshold=1, reset_timeout=60)
        retry = RetryPolicy(max_attempts=11, initial_backoff=0.05, max_backoff=0.05, jitter=0.05)
        attempts = {"crash": 0, "flaky": 0}
        flaky_failed = anyio.Event()

        @function_tool(limits=ToolLimits(retry=retry, circuit_breaker=policy))
        async def backend(mode: str) -> str:
            attempts[mode] += 1
            if mode == "crash":
                await flaky_failed.wait()
                raise RuntimeError("backend crashed")  # not retried: opens the breaker
            flaky_failed.set()
            raise ConnectionResetError("reset")  # retried with backoff

        executor = ToolExecutor([backend])
        crash, flaky = await executor.run_calls(
            [ToolCallRequest("backend", {"mode": m}) for m in ("crash", "flaky")]
        )
        # the breaker opened after the flaky call's first attempt; a retry that follows
        # is cut short instead of running all ten
        assert crash.error_kind == "ToolExecutionError" and crash.attempts == 1
        assert flaky.error_kind == "CircuitOpen", flaky.text
        assert 1 <= flaky.attempts < 11 and attempts["flaky"] == flaky.attempts
        assert executor.statistics().tools["backend"].retries == flaky.attempts - 1

    async def test_no_breaker_by_default(self) -> None:
        backend = Backend()
        executor = ToolExecutor([backend_tool(backend, circuit_breaker=None)])
        for _ in range(10):
            assert (await executor.run_call(call())).error_kind == "ToolUnavailable"
        assert backend.calls == 10
        assert executor.statistics().tools["search"].circuit_breaker is None
