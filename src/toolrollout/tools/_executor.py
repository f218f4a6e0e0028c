"""Runs one turn's tool calls concurrently, under per-tool limits, and never loses an error.

Every failure becomes an error :class:`ToolResult` that keeps the exception
(``result.error``, original as ``__cause__``), is logged and counted; cancellation
propagates. Per call: argument check (touches no limit), circuit breaker, then per
attempt a concurrency slot, a rate token and the tool under its timeout, with retries.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, cast

import anyio
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
)

from toolrollout._exceptions import (
    CircuitOpen,
    ModelBehaviorError,
    ToolArgumentError,
    ToolExecutionError,
    ToolNotFound,
    ToolRolloutError,
    ToolTimeout,
    ToolUnavailable,
    UserError,
)
from toolrollout._retry import retry_after_first

from ._base import Tool
from ._limits import (
    CircuitBreaker,
    CircuitBreakerStatistics,
    LatencyStatistics,
    LatencyWindow,
    LimiterStatistics,
    RateLimiter,
    RateLimiterStatistics,
    _Permit,
)
from ._types import RetryPolicy, ToolCallRequest, ToolContext, ToolLimits, ToolResult

__all__ = [
    "ExecutorStatistics",
    "ToolExecutor",
    "ToolStatistics",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ToolStatistics:
    """Counters of one tool since the executor was created."""

    name: str
    calls: int
    """Calls finished, successful or not."""
    errors: int
    """Calls that ended in an error result (any kind, timeouts included)."""
    timeouts: int
    """Calls whose last attempt hit the per-call timeout."""
    invalid_arguments: int
    """Calls rejected before running: bad JSON or arguments failing the schema."""
    retries: int
    """Attempts repeated after an infrastructure error (the sum of ``ToolResult.retries``)."""
    cancelled: int
    """Calls cancelled by their caller before they ended (not in ``calls``)."""
    in_flight: int
    """Calls accepted and not finished (waiting for a slot or running)."""
    running: int
    """Calls executing now (holding a concurrency slot)."""
    max_running: int
    """Highest ``running`` seen."""
    total_seconds: float
    """Summed wall time of finished calls."""
    latency: LatencyStatistics
    """Of the recent calls that reached the tool (``ToolResult.seconds``)."""
    limiter: LimiterStatistics
    """The tool's concurrency limiter."""
    rate_limiter: RateLimiterStatistics | None
    """The tool's rate limiter, if it has one."""
    circuit_breaker: CircuitBreakerStatistics | None
    """The tool's circuit breaker (state, open count, calls failed fast), if it has one."""


@dataclass(frozen=True, slots=True)
class ExecutorStatistics:
    """A snapshot of every tool's counters, plus calls to tools that do not exist."""

    tools: Mapping[str, ToolStatistics]
    unknown_tool_calls: int
    """Calls naming an unregistered tool (each also returned an error result)."""

    @property
    def calls(self) -> int:
        """All finished calls, unknown tools included."""
        return sum(s.calls for s in self.tools.values()) + self.unknown_tool_calls

    @property
    def errors(self) -> int:
        """All error results, unknown tools included."""
        return sum(s.errors for s in self.tools.values()) + self.unknown_tool_calls


class _Runtime:
    """Mutable per-tool state: the limiters and the counters behind :class:`ToolStatistics`."""

    def __init__(self, tool: Tool, latency_window: int, clock: Callable[[], float]) -> None:
        self.tool = tool
        limits = tool.limits
        total = math.inf if limits.max_concurrency is None else limits.max_concurrency
        self.limiter = anyio.CapacityLimiter(total)
        self.rate = (
            None
            if limits.rate_limit is None
            else RateLimiter(limits.rate_limit, burst=limits.rate_burst, clock=clock)
        )
        self.breaker = (
            None
            if limits.circuit_breaker is None
            else CircuitBreaker(tool.name, limits.circuit_breaker, clock=clock)
        )
        self.latency = LatencyWindow(latency_window)
        self.calls = 0
        self.errors = 0
        self.timeouts = 0
        self.invalid_arguments = 0
        self.retries = 0
        self.cancelled = 0
        self.in_flight = 0
        self.running = 0
        self.max_running = 0
        self.total_seconds = 0.0

    def snapshot(self) -> ToolStatistics:
        stats = self.limiter.statistics()
        return ToolStatistics(
            name=self.tool.name,
            calls=self.calls,
            errors=self.errors,
            timeouts=self.timeouts,
            invalid_arguments=self.invalid_arguments,
            retries=self.retries,
            cancelled=self.cancelled,
            in_flight=self.in_flight,
            running=self.running,
            max_running=self.max_running,
            total_seconds=self.total_seconds,
            latency=self.latency.statistics(),
            limiter=LimiterStatistics(
                total_tokens=stats.total_tokens,
                borrowed_tokens=stats.borrowed_tokens,
                tasks_waiting=stats.tasks_waiting,
            ),
            rate_limiter=None if self.rate is None else self.rate.statistics(),
            circuit_breaker=None if self.breaker is None else self.breaker.statistics(),
        )


@dataclass(slots=True)
class _CallState:
    """What one call's attempts share: the breaker permit and the number of attempts."""

    permit: _Permit | None = None
    attempts: int = 0


def _parse_arguments(call: ToolCallRequest) -> Mapping[str, Any]:
    """Arguments as a mapping; raw JSON text is parsed here, where failure is the model's."""
    arguments = call.arguments
    if isinstance(arguments, str):
        if not arguments.strip():
            return {}
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as exc:
            raise ToolArgumentError(
                f"invalid arguments for tool {call.name!r}: not valid JSON ({exc.msg} at "
                f"position {exc.pos})"
            ) from exc
    if not isinstance(arguments, Mapping):
        raise ToolArgumentError(
            f"invalid arguments for tool {call.name!r}: expected a JSON object, "
            f"got {type(arguments).__name__}"
        )
    return arguments


def _translate(exc: Exception, tool: Tool) -> ToolRolloutError:
    """Map any exception out of a tool into the tree, keeping the original as the cause."""
    if isinstance(exc, ToolRolloutError):
        return exc
    detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    error: ToolRolloutError
    if isinstance(exc, tool.limits.retry.retry_on):
        error = ToolUnavailable(f"tool {tool.name!r} is unavailable: {detail}")
    else:
        error = ToolExecutionError(f"tool {tool.name!r} raised {detail}")
    error.__cause__ = exc
    return error


def _should_retry(policy: RetryPolicy, exc: BaseException) -> bool:
    if isinstance(exc, CircuitOpen):
        return False
    if isinstance(exc, ToolTimeout):
        return policy.retry_timeouts
    return isinstance(exc, policy.retry_on) or isinstance(exc.__cause__, policy.retry_on)


class ToolExecutor:
    """Executes tool calls by name, concurrently and within limits.

    Shared by every trajectory of a run, so its per-tool limits are global. Use it from one
    event loop.
    """

    def __init__(
        self,
        tools: Iterable[Tool] = (),
        *,
        limits: Mapping[str, ToolLimits] | None = None,
        latency_window: int = 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``limits`` overrides the named tools' limits; ``latency_window`` is how many calls
        per tool the percentiles cover; ``clock`` is what breakers and rate limiters read."""
        if latency_window < 1:
            raise UserError(f"latency_window must be >= 1, got {latency_window}")
        runtimes: dict[str, _Runtime] = {}
        for tool in tools:
            if not isinstance(tool, Tool):
                raise UserError(f"expected a Tool, got {type(tool).__name__}: {tool!r}")
            if tool.name in runtimes:
                raise UserError(f"two tools are named {tool.name!r}; tool names must be unique")
            runtimes[tool.name] = _Runtime(tool, latency_window, clock)
        for name, override in (limits or {}).items():
            if name not in runtimes:
                raise UserError(f"limits given for unknown tool {name!r}")
            runtimes[name] = _Runtime(
                runtimes[name].tool.with_limits(override), latency_window, clock
            )
        self._runtimes = runtimes
        self._unknown_calls = 0

    @property
    def tools(self) -> Mapping[str, Tool]:
        """The registered tools by name (read-only)."""
        return MappingProxyType({name: rt.tool for name, rt in self._runtimes.items()})

    def schemas(self) -> list[dict[str, Any]]:
        """OpenAI tool schemas of all tools, in registration order (for the chat template)."""
        return [rt.tool.schema() for rt in self._runtimes.values()]

    def statistics(self) -> ExecutorStatistics:
        """A consistent snapshot of all counters and limiter states."""
        return ExecutorStatistics(
            tools=MappingProxyType({n: rt.snapshot() for n, rt in self._runtimes.items()}),
            unknown_tool_calls=self._unknown_calls,
        )

    async def run_calls(
        self, calls: Sequence[ToolCallRequest], context: ToolContext | None = None
    ) -> list[ToolResult]:
        """Run one turn's calls concurrently; results in call order. Never raises for a
        failing call; cancellation propagates and cancels every call of the turn."""
        ctx = context if context is not None else ToolContext()
        if len(calls) == 1:  # the common turn: no task group to run one call in
            return [await self.run_call(calls[0], ctx)]
        results: list[ToolResult | None] = [None] * len(calls)

        async def run_one(index: int, call: ToolCallRequest) -> None:
            results[index] = await self.run_call(call, ctx)

        async with anyio.create_task_group() as tg:
            for index, call in enumerate(calls):
                tg.start_soon(run_one, index, call, name=f"tool:{call.name}")
        # Every slot is filled: run_call never raises except on cancellation.
        return cast(list[ToolResult], results)

    async def run_call(
        self, call: ToolCallRequest, context: ToolContext | None = None
    ) -> ToolResult:
        """Run a single call (validation, breaker, limits, timeout, retries); never raises
        for it."""
        ctx = context if context is not None else ToolContext()
        started = time.perf_counter()
        runtime = self._runtimes.get(call.name)
        if runtime is None:
            self._unknown_calls += 1
            available = ", ".join(sorted(self._runtimes)) or "none"
            error = ToolNotFound(f"unknown tool {call.name!r}; available: {available}")
            logger.debug("%s", error)
            return ToolResult(
                text=f"Error: {error}",
                is_error=True,
                error=error,
                seconds=time.perf_counter() - started,
            )
        runtime.in_flight += 1
        state = _CallState()
        try:
            result = await self._run_checked(runtime, call, ctx, state)
        except anyio.get_cancelled_exc_class():
            runtime.cancelled += 1
            raise
        finally:
            runtime.in_flight -= 1
        seconds = time.perf_counter() - started
        runtime.calls += 1
        runtime.total_seconds += seconds
        if result.is_error:
            runtime.errors += 1
        if state.attempts:
            runtime.latency.record(seconds)
        return replace(result, seconds=seconds, attempts=state.attempts)

    async def _run_checked(
        self, runtime: _Runtime, call: ToolCallRequest, context: ToolContext, state: _CallState
    ) -> ToolResult:
        tool = runtime.tool
        try:
            arguments = _parse_arguments(call)
            tool.check_arguments(arguments)
        except ModelBehaviorError as error:
            runtime.invalid_arguments += 1
            logger.debug("%s", error)
            return ToolResult(text=f"Error: {error}", is_error=True, error=error)
        except Exception as exc:  # a broken check_arguments is the tool's fault
            broken = _translate(exc, tool)
            logger.warning("%s", broken, exc_info=broken)
            return ToolResult(text=f"Error: {broken}", is_error=True, error=broken)
        breaker = runtime.breaker
        if breaker is not None:
            try:
                state.permit = breaker.acquire()
            except CircuitOpen as error:
                logger.debug("%s", error)
                return ToolResult(text=f"Error: {error}", is_error=True, error=error)
        try:
            result = await self._run_with_retries(runtime, arguments, context, state)
        except ToolRolloutError as error:
            if breaker is not None and state.permit is not None:
                breaker.record(state.permit, error)
            if isinstance(error, CircuitOpen):
                logger.debug("%s", error)
            elif isinstance(error, ToolTimeout):
                runtime.timeouts += 1
                logger.warning("%s", error)
            elif isinstance(error, ModelBehaviorError):
                if isinstance(error, ToolArgumentError):
                    runtime.invalid_arguments += 1
                logger.debug("%s", error)
            elif isinstance(error, ToolUnavailable):
                # An outage is expected infrastructure trouble: one line a call (a dead
                # server fails every call until it is back); the traceback only for DEBUG.
                logger.warning("%s", error, exc_info=logger.isEnabledFor(logging.DEBUG))
            else:
                logger.warning("%s", error, exc_info=error)
            return ToolResult(text=f"Error: {error}", is_error=True, error=error)
        except BaseException:  # cancelled: the call says nothing about the backend
            if breaker is not None and state.permit is not None:
                breaker.release(state.permit)
            raise
        if breaker is not None and state.permit is not None:
            breaker.record(state.permit, None)
        return result

    async def _run_with_retries(
        self,
        runtime: _Runtime,
        arguments: Mapping[str, Any],
        context: ToolContext,
        state: _CallState,
    ) -> ToolResult:
        policy = runtime.tool.limits.retry
        state.attempts += 1

        async def again() -> ToolResult:
            # a retry: not if the breaker opened meanwhile
            if runtime.breaker is not None and state.permit is not None:
                runtime.breaker.check(state.permit)
            runtime.retries += 1
            state.attempts += 1
            return await self._attempt(runtime, arguments, context)

        return await retry_after_first(
            lambda: self._attempt(runtime, arguments, context),
            lambda exc: policy.max_attempts > 1 and _should_retry(policy, exc),
            lambda: AsyncRetrying(
                stop=stop_after_attempt(policy.max_attempts),
                wait=lambda retry_state: policy.backoff(retry_state.attempt_number),
                retry=retry_if_exception(lambda exc: _should_retry(policy, exc)),
                sleep=anyio.sleep,
                reraise=True,
            ),
            again=again,
        )

    async def _attempt(
        self, runtime: _Runtime, arguments: Mapping[str, Any], context: ToolContext
    ) -> ToolResult:
        """One attempt: a concurrency slot, then a rate token, then the call under timeout."""
        tool = runtime.tool
        timeout = tool.limits.timeout
        async with runtime.limiter:
            if runtime.rate is not None:
                await runtime.rate.acquire()
            runtime.running += 1
            runtime.max_running = max(runtime.max_running, runtime.running)
            try:
                with anyio.fail_after(timeout) as scope:
                    result = await tool.call(arguments, context)
            except Exception as exc:
                if isinstance(exc, TimeoutError) and scope.cancelled_caught:
                    raise ToolTimeout(f"tool {tool.name!r} timed out after {timeout:g}s") from None
                error = _translate(exc, tool)
                if error is exc:
                    raise
                raise error from exc
            finally:
                runtime.running -= 1
        if not isinstance(result, ToolResult):
            raise ToolExecutionError(
                f"tool {tool.name!r} returned {type(result).__name__}, not a ToolResult"
            )
        return result
