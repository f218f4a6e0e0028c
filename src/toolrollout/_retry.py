"""One retry policy for engine requests and tool calls: how often, and how patiently.

Both the engine client and the tool executor count attempts the same way (``max_attempts``
includes the first one) and wait the same way between them. What counts as a transient
failure is each caller's business: the engine client retries connection errors, 429 and
5xx answers; the tool executor retries the exception types in :attr:`RetryPolicy.retry_on`.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from toolrollout._exceptions import ToolUnavailable, UserError

if TYPE_CHECKING:
    from tenacity import AsyncRetrying

__all__ = ["ENGINE_RETRY", "RetryPolicy", "retry_after_first"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often, and how patiently, a failed call is tried again.

    The wait before retry ``k`` (1-based) is
    ``min(initial_backoff * 2**(k-1) + uniform(0, jitter), max_backoff)`` seconds. A call
    gives up at ``max_attempts`` or, with ``budget_s``, once ``budget_s`` seconds have passed
    since its first failed attempt, whichever comes first (the last wait is shortened to
    end at the budget). The engine client's default is :data:`ENGINE_RETRY` (time-bounded:
    it rides out a server or router restart of up to a minute); a tool without its own
    policy gets 3 attempts with a 0.1 s first wait (``ToolLimits().retry``).
    """

    max_attempts: int = 5
    """Total attempts, the first included (1 disables retries)."""
    initial_backoff: float = 0.5
    """Seconds before the first retry (before jitter); doubled for each later one."""
    max_backoff: float = 30.0
    """Upper bound of one wait."""
    jitter: float = 0.5
    """Random extra wait, so that many rollouts do not retry in lockstep."""
    retry_timeouts: bool = False
    """Also retry an attempt that was sent but not answered in time (an engine's read
    timeout, a tool's per-call ``timeout``): off by default, since a slow call usually
    stays slow and a retry doubles the load."""
    budget_s: float | None = None
    """Seconds of retrying: no attempt starts later than this after the first failed
    attempt ended (None: attempts only). Counted from the first failure, not the first
    send, so a long generation that then fails still gets the whole budget."""
    retry_on: tuple[type[BaseException], ...] = (ToolUnavailable, ConnectionError)
    """Exception types a tool call is retried on (transient infrastructure errors; a tool
    that raised because of its input would fail the same way again). The engine client
    classifies its own errors and does not read this."""

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise UserError(f"RetryPolicy.max_attempts must be >= 1, got {self.max_attempts}")
        if min(self.initial_backoff, self.max_backoff, self.jitter) < 0:
            raise UserError("RetryPolicy backoff and jitter must not be negative")
        if self.budget_s is not None and not self.budget_s >= 0:
            raise UserError(f"RetryPolicy.budget_s must be >= 0, got {self.budget_s}")

    @property
    def retries(self) -> int:
        """Attempts after the first one (``max_attempts - 1``)."""
        return self.max_attempts - 1

    def backoff(self, retry_number: int) -> float:
        """Seconds to wait before retry ``retry_number`` (1 for the first retry)."""
        exponential = self.initial_backoff * 2.0 ** (retry_number - 1)
        return min(exponential + random.uniform(0.0, self.jitter), self.max_backoff)


ENGINE_RETRY = RetryPolicy(max_attempts=30, initial_backoff=0.5, max_backoff=4.0, budget_s=60.0)
"""The engine client's default: up to 60 s of retrying (at most 30 attempts, waits capped at
4 s so a server that is back is found within seconds). A worker or router restart of 30 s
or more is ridden out; a server that stays down fails its requests after about a minute
(or moves them to a healthy server first, see ``SGLangClient(failover_after=...)``)."""


async def retry_after_first(
    attempt: Callable[[], Awaitable[T]],
    should_retry: Callable[[BaseException], bool],
    retrying: Callable[[], AsyncRetrying],
    *,
    again: Callable[[], Awaitable[T]] | None = None,
) -> T:
    """Run ``attempt`` once outside tenacity; only a failure that ``should_retry`` accepts
    builds ``retrying()``, and becomes its first attempt, so its stop, waits and counts are
    those of a plain tenacity loop. Later attempts run ``again`` (default ``attempt``).

    Most engine and tool calls succeed at once, and building tenacity's machinery for
    every call was a measurable share of a turn's CPU (docs/benchmarks.md, client cost).
    """
    try:
        return await attempt()
    except Exception as exc:
        if not should_retry(exc):
            raise
        first: Exception | None = exc
    retry = again if again is not None else attempt
    async for manager in retrying():
        with manager:
            if first is not None:
                failed, first = first, None
                raise failed
            return await retry()
    raise AssertionError("unreachable: tenacity either returns or raises")
