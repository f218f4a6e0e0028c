"""Observable limiters: a token-bucket rate limiter on anyio, and statistics snapshots.

anyio has a concurrency limiter but no rate limiter; this one is small, fair (waiters are
served in arrival order through an anyio lock) and reports its state like anyio's
``CapacityLimiter.statistics()`` does, so "rate limited" is something you can see.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import anyio

from toolrollout._exceptions import UserError

__all__ = ["LimiterStatistics", "RateLimiter", "RateLimiterStatistics"]


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
    """At most ``rate`` acquisitions per second, with bursts of up to ``burst``."""

    def __init__(self, rate: float, burst: int = 1) -> None:
        if not (rate > 0 and math.isfinite(rate)):
            raise UserError(f"rate must be a positive number, got {rate}")
        if burst < 1:
            raise UserError(f"burst must be >= 1, got {burst}")
        self.rate = float(rate)
        self.burst = burst
        self._tokens = float(burst)
        self._updated: float | None = None
        self._lock: anyio.Lock | None = None
        self._waiting = 0
        self._acquired = 0

    def _refill(self) -> float:
        now = anyio.current_time()
        if self._updated is not None:
            self._tokens = min(self.burst, self._tokens + (now - self._updated) * self.rate)
        self._updated = now
        return now

    async def acquire(self) -> None:
        """Wait for a token. Cancellation while waiting consumes nothing."""
        if self._lock is None:  # created lazily: needs a running event loop
            self._lock = anyio.Lock()
        self._waiting += 1
        try:
            async with self._lock:
                self._refill()
                while self._tokens < 1:
                    await anyio.sleep((1 - self._tokens) / self.rate)
                    self._refill()
                self._tokens -= 1
                self._acquired += 1
        finally:
            self._waiting -= 1

    def statistics(self) -> RateLimiterStatistics:
        """A snapshot of the bucket (tokens are refilled up to now first)."""
        tokens = self._tokens
        if self._updated is not None:
            try:
                now = anyio.current_time()
            except RuntimeError:  # no event loop: report the last known level
                now = self._updated
            tokens = min(self.burst, tokens + (now - self._updated) * self.rate)
        return RateLimiterStatistics(
            rate=self.rate,
            burst=self.burst,
            tokens_available=tokens,
            tasks_waiting=self._waiting,
            acquired=self._acquired,
        )
