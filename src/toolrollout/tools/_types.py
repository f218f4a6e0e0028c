"""Plain frozen values that cross the tool seam: calls in, results out, limits as data."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from toolrollout._exceptions import (
    ModelBehaviorError,
    ToolError,
    ToolExecutionError,
    ToolRolloutError,
    ToolTimeout,
    ToolUnavailable,
    UserError,
)
from toolrollout._retry import RetryPolicy

__all__ = [
    "DEFAULT_TOOL_RETRY",
    "CircuitBreakerPolicy",
    "RetryPolicy",
    "ToolCallRequest",
    "ToolContext",
    "ToolLimits",
    "ToolResult",
    "ToolSessionProtocol",
]


@dataclass(frozen=True, slots=True)
class ToolCallRequest:
    """One tool call as parsed from a model turn."""

    name: str
    """The function name the model asked for (may be unknown: the executor answers that)."""
    arguments: Mapping[str, Any] | str
    """Parsed arguments, or the raw JSON text (parsed and checked by the executor)."""
    id: str | None = None
    """The call id echoed back in the ``tool`` message, where the chat format has one."""


class ToolSessionProtocol(Protocol):
    """What a stateful tool asks of its trajectory's :class:`~toolrollout.tools.ToolSession`."""

    async def instance_for(self, tool: Any, context: ToolContext) -> str:
        """The instance id of ``tool`` (a ``StatefulTool``) for this trajectory."""
        ...


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a tool may know about the trajectory that calls it."""

    trajectory_id: str = ""
    """Unique id of the calling trajectory (stable across its turns)."""
    sample_index: int = 0
    """Index of the sample within its prompt's group."""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    """The dataset row's extra fields (read-only by convention), e.g. verl's ``tools_kwargs``."""
    ground_truth: Any = None
    """The row's reference answer, for answer-checking tools such as the GSM8K tool."""
    state: dict[str, Any] = field(default_factory=dict)
    """Scratch space shared by all tool calls of one trajectory (one dict per trajectory)."""
    session: ToolSessionProtocol | None = field(default=None, compare=False, repr=False)
    """The trajectory's stateful-tool instances (see :class:`~toolrollout.tools.StatefulTool`);
    None outside a rollout."""


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What a tool call produced, as fed back to the model and recorded on the trajectory."""

    text: str
    """The text the model sees in the ``tool`` message."""
    images: tuple[Any, ...] = ()
    """Images (PIL images or encoded bytes) for multimodal tool messages."""
    is_error: bool = False
    """True when the call failed; ``text`` then explains the failure to the model."""
    structured: dict[str, Any] | None = None
    """Machine-readable payload (a returned dict, or MCP ``structuredContent``)."""
    reward: float | None = None
    """Per-call reward contributed by the tool (verl's ``tool_reward``), if any."""
    metrics: Mapping[str, float] = field(default_factory=dict)
    """Per-call numbers a tool wants logged (verl's tool ``metrics``)."""
    seconds: float = 0.0
    """Wall time the executor spent on the call: queueing, attempts and backoff."""
    attempts: int = 0
    """Attempts the executor started (1 + retries); 0 when the call never reached the tool."""
    error: ToolRolloutError | None = field(default=None, compare=False, repr=False)
    """The translated exception behind an error result; its ``__cause__`` is the original."""

    @property
    def retries(self) -> int:
        """Attempts repeated after an infrastructure error (``attempts - 1``, at least 0)."""
        return max(self.attempts - 1, 0)

    @property
    def error_kind(self) -> str | None:
        """Class name of :attr:`error` (``"ToolTimeout"``...), or None; stable for logging."""
        return None if self.error is None else type(self.error).__name__


DEFAULT_TOOL_RETRY = RetryPolicy(max_attempts=3, initial_backoff=0.1, max_backoff=2.0, jitter=0.1)
"""A tool's retry policy unless it sets its own: 2 retries, on ToolUnavailable and
ConnectionError only."""


@dataclass(frozen=True, slots=True)
class CircuitBreakerPolicy:
    """When a tool stops being called: after ``failure_threshold`` consecutive failed calls
    it fails fast (CircuitOpen) for ``reset_timeout`` seconds, then lets one trial through.

    A call counts once, after its retries, and only for infrastructure errors (``trip_on``);
    a returned result, even an ``is_error`` one, is a success: the backend answered.
    """

    failure_threshold: int = 5
    """Consecutive failed calls that open the breaker."""
    reset_timeout: float = 30.0
    """Seconds the breaker stays open before it lets one trial call through."""
    trip_on: tuple[type[ToolError], ...] = (ToolUnavailable, ToolTimeout, ToolExecutionError)
    """Error types that count as failures; other errors neither count nor reset the count."""

    def __post_init__(self) -> None:
        if self.failure_threshold < 1:
            raise UserError(f"failure_threshold must be >= 1, got {self.failure_threshold}")
        if not (self.reset_timeout > 0 and math.isfinite(self.reset_timeout)):
            raise UserError(
                f"reset_timeout must be a positive number of seconds, got {self.reset_timeout}"
            )
        if not self.trip_on:
            raise UserError("trip_on must name at least one error type")
        for kind in self.trip_on:
            if not (isinstance(kind, type) and issubclass(kind, ToolError)):
                what = kind.__name__ if isinstance(kind, type) else repr(kind)
                hint = (
                    " (the model's mistakes never trip a breaker)"
                    if isinstance(kind, type) and issubclass(kind, ModelBehaviorError)
                    else ""
                )
                raise UserError(f"trip_on: {what} is not a ToolError{hint}")


@dataclass(frozen=True, slots=True)
class ToolLimits:
    """Per-tool execution limits, enforced by :class:`~toolrollout.tools.ToolExecutor`."""

    timeout: float | None = 60.0
    """Seconds one attempt may run (None: no limit); slot and rate waits do not count."""
    max_concurrency: int | None = None
    """Calls of this tool running at once, across all trajectories (None: unlimited)."""
    rate_limit: float | None = None
    """Attempts started per second (None: unlimited)."""
    rate_burst: int = 1
    """Attempts that may start back to back before the rate applies."""
    retry: RetryPolicy = DEFAULT_TOOL_RETRY
    """Which failures are retried, and how often."""
    circuit_breaker: CircuitBreakerPolicy | None = None
    """Fail fast after repeated infrastructure failures (None: no breaker)."""

    def __post_init__(self) -> None:
        if self.timeout is not None and not (self.timeout > 0 and math.isfinite(self.timeout)):
            raise UserError(f"timeout must be a positive number of seconds, got {self.timeout}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise UserError(f"max_concurrency must be >= 1, got {self.max_concurrency}")
        if self.rate_limit is not None and not (
            self.rate_limit > 0 and math.isfinite(self.rate_limit)
        ):
            raise UserError(f"rate_limit must be a positive number, got {self.rate_limit}")
        if self.rate_burst < 1:
            raise UserError(f"rate_burst must be >= 1, got {self.rate_burst}")
