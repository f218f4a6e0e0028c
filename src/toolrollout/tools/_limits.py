"""Observable per-tool limits: rate limiter, circuit breaker, latency window, and snapshots.

Each piece reports its state as a frozen dataclass, as anyio's ``CapacityLimiter`` does.
The circuit breaker is our own: no maintained async breaker library offers a single trial
call, per-instance state and readable statistics.
"""

from __future__ import annotations

import enum
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from aiolimiter import AsyncLimiter

from toolrollout._exceptions import CircuitOpen, UserError

from ._types import CircuitBreakerPolicy

__all__ = [
    "CircuitBreaker",
    "CircuitBreakerStatistics",
    "CircuitState",
    "LatencyStatistics",
    "LatencyWindow",
    "LimiterStatistics",
    "RateLimiter",
    "RateLimiterStatistics",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LimiterStatistics:
    """A concurrency limiter's state (anyio's, minus the borrower objects)."""

    total_tokens: float
    """Maximum concurrent calls (``inf`` when unlimited)."""
    borrowed_tokens: int
    """Calls holding a slot now."""
    tasks_waiting: int
    """Calls queued for a slot."""


@dataclass(frozen=True, slots=True)
class RateLimiterStatistics:
    """A rate limiter's state."""

    rate: float
    """Tokens added per second."""
    burst: int
    """Bucket capacity."""
    tokens_available: float
    """Tokens in the bucket at the time of the snapshot."""
    tasks_waiting: int
    """Calls waiting for a token."""
    acquired: int
    """Tokens handed out since creation."""


class RateLimiter:
    """At most ``rate`` acquisitions per second, with bursts of up to ``burst``, in arrival
    order (``aiolimiter``'s leaky bucket of capacity ``burst``: asyncio only).

    ``clock`` is the clock of :meth:`statistics` and must be the event loop's
    (``time.monotonic`` for asyncio's default loop, ``loop.time`` for a virtual one).
    """

    def __init__(
        self, rate: float, burst: int = 1, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not (rate > 0 and math.isfinite(rate)):
            raise UserError(f"rate must be a positive number, got {rate}")
        if burst < 1:
            raise UserError(f"burst must be >= 1, got {burst}")
        self.rate = float(rate)
        self.burst = burst
        self._limiter = AsyncLimiter(max_rate=burst, time_period=burst / self.rate)
        # A mirror of the bucket's fill level, for statistics (aiolimiter's is private).
        self._clock = clock
        self._level = 0.0
        self._updated = clock()
        self._waiting = 0
        self._acquired = 0

    def _level_at(self, now: float) -> float:
        return max(self._level - (now - self._updated) * self.rate, 0.0)

    async def acquire(self) -> None:
        """Wait until the rate allows one more call."""
        self._waiting += 1
        try:
            await self._limiter.acquire()
        finally:
            self._waiting -= 1
        now = self._clock()
        self._level = self._level_at(now) + 1
        self._updated = now
        self._acquired += 1

    def statistics(self) -> RateLimiterStatistics:
        """A snapshot of the bucket (drained up to now first)."""
        level = self._level_at(self._clock())
        return RateLimiterStatistics(
            rate=self.rate,
            burst=self.burst,
            tokens_available=min(max(self.burst - level, 0.0), float(self.burst)),
            tasks_waiting=self._waiting,
            acquired=self._acquired,
        )


class CircuitState(enum.StrEnum):
    """Where a circuit breaker stands."""

    CLOSED = "closed"
    """Calls go through; consecutive failures are counted."""
    OPEN = "open"
    """Calls fail fast (:class:`~toolrollout.exceptions.CircuitOpen`) for ``reset_timeout``."""
    HALF_OPEN = "half_open"
    """The next call (only one) is a trial: success closes the breaker, failure re-opens it."""


@dataclass(frozen=True, slots=True)
class CircuitBreakerStatistics:
    """A circuit breaker's state and history."""

    state: CircuitState
    """``half_open`` as soon as ``reset_timeout`` has passed, even before a trial call."""
    consecutive_failures: int
    """Failed calls in a row (the trial's failure included); reset by a success."""
    failure_threshold: int
    """Consecutive failures that open the breaker."""
    reset_timeout: float
    """Seconds the breaker stays open before a trial call."""
    open_count: int
    """Times the breaker opened (from closed, or again after a failed trial)."""
    rejected_calls: int
    """Calls failed fast without reaching the tool."""
    retry_after: float
    """Seconds until a trial call is let through (0.0 unless open)."""
    last_failure: str | None
    """``"Kind: message"`` of the last counted failure."""


@dataclass(frozen=True, slots=True)
class _Permit:
    """Admission of one call: the breaker's epoch at admission, and whether it is the trial."""

    epoch: int
    trial: bool


class CircuitBreaker:
    """Closed -> open after N consecutive failures -> half-open after T -> closed or open.

    Used from one event loop (no lock). Outcomes of calls admitted before the last state
    change are ignored; only the trial's outcome moves a half-open breaker.
    """

    def __init__(
        self,
        name: str,
        policy: CircuitBreakerPolicy,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.policy = policy
        self._clock = clock
        self._state = CircuitState.CLOSED
        self._epoch = 0
        self._failures = 0
        self._opened_at = 0.0
        self._trial_in_flight = False
        self._open_count = 0
        self._rejected = 0
        self._last_failure: str | None = None

    @property
    def state(self) -> CircuitState:
        """The current state (an open breaker whose timeout has passed reads half-open)."""
        if self._state is CircuitState.OPEN and self._retry_after() <= 0:
            return CircuitState.HALF_OPEN
        return self._state

    def _retry_after(self) -> float:
        return max(self._opened_at + self.policy.reset_timeout - self._clock(), 0.0)

    def _reject(self) -> CircuitOpen:
        self._rejected += 1
        retry_after = self._retry_after() if self._state is CircuitState.OPEN else 0.0
        last = f" (last: {self._last_failure})" if self._last_failure else ""
        if self._state is CircuitState.OPEN:
            detail = f"failing fast for another {retry_after:.1f}s"
        else:
            detail = "half-open, its trial call is in flight"
        return CircuitOpen(
            f"tool {self.name!r} is unavailable: circuit breaker open after "
            f"{self._failures} consecutive failures{last}; {detail}",
            tool=self.name,
            retry_after=retry_after,
        )

    def acquire(self) -> _Permit:
        """Admit a call, or raise :class:`~toolrollout.exceptions.CircuitOpen` to fail it fast."""
        if self._state is CircuitState.CLOSED:
            return _Permit(self._epoch, trial=False)
        if self._state is CircuitState.OPEN and self._retry_after() <= 0:
            self._state = CircuitState.HALF_OPEN
        if self._state is CircuitState.HALF_OPEN and not self._trial_in_flight:
            self._trial_in_flight = True
            return _Permit(self._epoch, trial=True)
        raise self._reject()

    def check(self, permit: _Permit) -> None:
        """Before a retry: raise CircuitOpen if the breaker opened since the call was admitted."""
        if permit.epoch != self._epoch and self._state is not CircuitState.CLOSED:
            raise self._reject()

    def counts(self, error: BaseException) -> bool:
        """Whether ``error`` counts as a failure of the backend."""
        return isinstance(error, self.policy.trip_on) and not isinstance(error, CircuitOpen)

    def record(self, permit: _Permit, error: BaseException | None) -> None:
        """Record a finished call: ``error`` None is a success; one that does not
        :meth:`count <counts>` is neutral."""
        if error is not None and not self.counts(error):
            self.release(permit)
            return
        if permit.epoch != self._epoch:
            return  # admitted before the last state change: stale
        if permit.trial:
            self._trial_in_flight = False
        elif self._state is not CircuitState.CLOSED:
            return
        if error is None:
            self._failures = 0
            if self._state is not CircuitState.CLOSED:
                self._state = CircuitState.CLOSED
                self._epoch += 1
                logger.info(
                    "circuit breaker of tool %r closed: the trial call succeeded", self.name
                )
            return
        self._failures += 1
        self._last_failure = (
            f"{type(error).__name__}: {error}" if str(error) else (type(error).__name__)
        )
        if permit.trial or self._failures >= self.policy.failure_threshold:
            self._state = CircuitState.OPEN
            self._opened_at = self._clock()
            self._epoch += 1
            self._open_count += 1
            logger.warning(
                "circuit breaker of tool %r opened after %d consecutive failures (last: %s); "
                "failing fast for %gs",
                self.name,
                self._failures,
                self._last_failure,
                self.policy.reset_timeout,
            )

    def release(self, permit: _Permit) -> None:
        """Forget a call that says nothing about the backend (cancelled, or its input's
        fault): a trial slot is freed."""
        if permit.trial and permit.epoch == self._epoch:
            self._trial_in_flight = False

    def statistics(self) -> CircuitBreakerStatistics:
        """A snapshot of the breaker."""
        state = self.state
        return CircuitBreakerStatistics(
            state=state,
            consecutive_failures=self._failures,
            failure_threshold=self.policy.failure_threshold,
            reset_timeout=self.policy.reset_timeout,
            open_count=self._open_count,
            rejected_calls=self._rejected,
            retry_after=self._retry_after() if state is CircuitState.OPEN else 0.0,
            last_failure=self._last_failure,
        )


def quantile(sorted_values: list[float], q: float) -> float:
    """The ``q``-quantile of ascending values, as numpy's default (``method="linear"``)."""
    if not sorted_values:
        raise ValueError("quantile of no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q}")
    position = q * (len(sorted_values) - 1)
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    fraction = position - low
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * fraction


@dataclass(frozen=True, slots=True)
class LatencyStatistics:
    """Latency of a tool's recent calls, in seconds (None while no call has finished)."""

    count: int
    """Calls recorded since creation (the percentiles use only the last ``window``)."""
    window: int
    """Capacity of the ring buffer of recent latencies."""
    p50: float | None
    """Median of the recent latencies."""
    p95: float | None
    """95th percentile of the recent latencies."""
    max: float | None
    """Largest of the recent latencies."""
    mean: float | None
    """Mean of the recent latencies."""


class LatencyWindow:
    """The last ``size`` latencies (a ring buffer); exact percentiles at snapshot time."""

    def __init__(self, size: int = 1024) -> None:
        if size < 1:
            raise UserError(f"latency window size must be >= 1, got {size}")
        self.size = size
        self._values: deque[float] = deque(maxlen=size)
        self._count = 0

    def record(self, seconds: float) -> None:
        """Add one latency (the oldest drops out once the window is full)."""
        self._values.append(seconds)
        self._count += 1

    def statistics(self) -> LatencyStatistics:
        """Percentiles of the window (see :func:`quantile`)."""
        if not self._values:
            return LatencyStatistics(self._count, self.size, None, None, None, None)
        values = sorted(self._values)
        return LatencyStatistics(
            count=self._count,
            window=self.size,
            p50=quantile(values, 0.5),
            p95=quantile(values, 0.95),
            max=values[-1],
            mean=sum(values) / len(values),
        )
