"""Runs one turn's tool calls concurrently, under per-tool limits, and never loses an error.

Every failure becomes an error :class:`ToolResult` the model can read, *and* keeps the
exception from the one tree (``result.error``, original as ``__cause__``), is logged and is
counted in :meth:`ToolExecutor.statistics`, so nothing is swallowed silently. Cancellation
from outside is never turned into a result: it propagates.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, cast

import anyio
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from toolrollout._exceptions import (
    ModelBehaviorError,
    ToolArgumentError,
    ToolExecutionError,
    ToolNotFound,
    ToolRolloutError,
    ToolTimeout,
    ToolUnavailable,
    UserError,
)

from ._base import Tool
from ._limits import LimiterStatistics, RateLimiter, RateLimiterStatistics
from ._types import RetryPolicy, ToolCallRequest, ToolContext, ToolLimits, ToolResult

__all__ = ["ExecutorStatistics", "ToolExecutor", "ToolStatistics"]

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
    """Attempts repeated after an infrastructure error."""
    in_flight: int
    """Calls accepted and not finished (waiting for a slot or running)."""
    running: int
    """Calls executing now (holding a concurrency slot)."""
    max_running: int
    """Highest ``running`` seen."""
    total_seconds: float
    """Summed wall time of finished calls."""
    limiter: LimiterStatistics
    """The tool's concurrency limiter."""
    rate_limiter: RateLimiterStatistics | None
    """The tool's rate limiter, if it has one."""


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

    def __init__(self, tool: Tool) -> None:
        self.tool = tool
        limits = tool.limits
        total = math.inf if limits.max_concurrency is None else limits.max_concurrency
        self.limiter = anyio.CapacityLimiter(total)
        self.rate = (
            None
            if limits.rate_limit is None
            else RateLimiter(limits.rate_limit, burst=limits.rate_burst)
        )
        self.calls = 0
        self.errors = 0
        self.timeouts = 0
        self.invalid_arguments = 0
        self.retries = 0
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
            in_flight=self.in_flight,
            running=self.running,
            max_running=self.max_running,
            total_seconds=self.total_seconds,
            limiter=LimiterStatistics(
                total_tokens=stats.total_tokens,
                borrowed_tokens=stats.borrowed_tokens,
                tasks_waiting=stats.tasks_waiting,
            ),
            rate_limiter=None if self.rate is None else self.rate.statistics(),
        )


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
    if isinstance(exc, ToolTimeout):
        return policy.retry_on_timeout
    return isinstance(exc, policy.retry_on) or isinstance(exc.__cause__, policy.retry_on)


class ToolExecutor:
    """Executes tool calls by name, one turn at a time, concurrently and within limits.

    One executor is shared by every trajectory of a run, so its per-tool limits are global
    (e.g. "at most 8 sandbox calls at once, whoever makes them"). Use it from one event loop.
    """

    def __init__(
        self, tools: Iterable[Tool] = (), *, limits: Mapping[str, ToolLimits] | None = None
    ) -> None:
        """``limits`` overrides the limits carried by the named tools."""
        runtimes: dict[str, _Runtime] = {}
        for tool in tools:
            if not isinstance(tool, Tool):
                raise UserError(f"expected a Tool, got {type(tool).__name__}: {tool!r}")
            if tool.name in runtimes:
                raise UserError(f"two tools are named {tool.name!r}; tool names must be unique")
            runtimes[tool.name] = _Runtime(tool)
        for name, override in (limits or {}).items():
            if name not in runtimes:
                raise UserError(f"limits given for unknown tool {name!r}")
            runtimes[name] = _Runtime(runtimes[name].tool.with_limits(override))
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
        """Run one turn's calls concurrently; results come back in call order.

        Never raises for a failing call (each becomes an error result); only cancellation
        of the caller propagates, and it cancels every call of the turn.
        """
        ctx = context if context is not None else ToolContext()
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
        """Run a single call (validation, limits, timeout, retries); never raises for it."""
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
        try:
            result = await self._run_checked(runtime, call, ctx)
        finally:
            runtime.in_flight -= 1
        seconds = time.perf_counter() - started
        runtime.calls += 1
        runtime.total_seconds += seconds
        if result.is_error:
            runtime.errors += 1
        return replace(result, seconds=seconds)

    async def _run_checked(
        self, runtime: _Runtime, call: ToolCallRequest, context: ToolContext
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
        try:
            return await self._run_with_retries(runtime, arguments, context)
        except ToolRolloutError as error:
            if isinstance(error, ToolTimeout):
                runtime.timeouts += 1
                logger.warning("%s", error)
            elif isinstance(error, ModelBehaviorError):
                if isinstance(error, ToolArgumentError):
                    runtime.invalid_arguments += 1
                logger.debug("%s", error)
            else:
                logger.warning("%s", error, exc_info=error)
            return ToolResult(text=f"Error: {error}", is_error=True, error=error)

    async def _run_with_retries(
        self, runtime: _Runtime, arguments: Mapping[str, Any], context: ToolContext
    ) -> ToolResult:
        policy = runtime.tool.limits.retry

        def count_retry(state: RetryCallState) -> None:
            runtime.retries += 1

        retrying = AsyncRetrying(
            stop=stop_after_attempt(policy.retries + 1),
            wait=wait_exponential(multiplier=policy.backoff, max=policy.max_backoff)
            + wait_random(0, policy.backoff),
            retry=retry_if_exception(lambda exc: _should_retry(policy, exc)),
            before_sleep=count_retry,
            sleep=anyio.sleep,
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                return await self._attempt(runtime, arguments, context)
        raise AssertionError("unreachable: tenacity either returns or re-raises")

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
