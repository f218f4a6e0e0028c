"""One retry policy for engine requests and tool calls: how often, and how patiently.

Both the engine client and the tool executor count attempts the same way (``max_attempts``
includes the first one) and wait the same way between them. What counts as a transient
failure is each caller's business: the engine client retries connection errors, 429 and
5xx answers; the tool executor retries the exception types in :attr:`RetryPolicy.retry_on`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from toolrollout._exceptions import ToolUnavailable, UserError

__all__ = ["RetryPolicy"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often, and how patiently, a failed call is tried again.

    The wait before retry ``k`` (1-based) is
    ``min(initial_backoff * 2**(k-1) + uniform(0, jitter), max_backoff)`` seconds. The
    defaults are the engine client's; a tool without its own policy gets 3 attempts with a
    0.1 s first wait (``ToolLimits().retry``).
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
    retry_on: tuple[type[BaseException], ...] = (ToolUnavailable, ConnectionError)
    """Exception types a tool call is retried on (transient infrastructure errors; a tool
    that raised because of its input would fail the same way again). The engine client
    classifies its own errors and does not read this."""

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise UserError(f"RetryPolicy.max_attempts must be >= 1, got {self.max_attempts}")
        if min(self.initial_backoff, self.max_backoff, self.jitter) < 0:
            raise UserError("RetryPolicy backoff and jitter must not be negative")

    @property
    def retries(self) -> int:
        """Attempts after the first one (``max_attempts - 1``)."""
        return self.max_attempts - 1

    def backoff(self, retry_number: int) -> float:
        """Seconds to wait before retry ``retry_number`` (1 for the first retry)."""
        exponential = self.initial_backoff * 2.0 ** (retry_number - 1)
        return min(exponential + random.uniform(0.0, self.jitter), self.max_backoff)
