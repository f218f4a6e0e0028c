"""What a benchmark run is judged by, computed from the servers' own logs.

The *ideal makespan* is a lower bound no scheduler can beat: the server cannot finish
before its total slot time is spread over all ``capacity`` slots, and no trajectory can
finish before its critical path (its own generations back to back with its own tool
calls, with no queueing anywhere). *Orchestration efficiency* is that bound divided by the
measured makespan: 1.0 means the client added nothing to the unavoidable time.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "ModeResult",
    "critical_paths",
    "ideal_makespan",
    "orchestration_efficiency",
]


def critical_paths(
    requests: Iterable[Mapping[str, Any]], tool_calls: Iterable[Mapping[str, Any]]
) -> dict[str, float]:
    """Seconds per trajectory key: its requests' slot time plus its tool calls' latency.

    ``requests`` are the latency server's log entries (``key``, ``slot_seconds``);
    ``tool_calls`` the tool service's (``key`` of the form ``<trajectory>.<turn>``,
    ``seconds``).
    """
    paths: dict[str, float] = defaultdict(float)
    for request in requests:
        key = request.get("key")
        if key is not None:
            paths[str(key)] += float(request["slot_seconds"])
    for call in tool_calls:
        trajectory = str(call["key"]).rsplit(".", 1)[0]
        paths[trajectory] += float(call["seconds"])
    return dict(paths)


def ideal_makespan(paths: Mapping[str, float], total_slot_seconds: float, capacity: int) -> float:
    """``max(longest critical path, total slot time / capacity)``."""
    if capacity < 1:
        raise ValueError("capacity must be at least 1")
    longest = max(paths.values(), default=0.0)
    return max(longest, total_slot_seconds / capacity)


def orchestration_efficiency(ideal: float, measured: float) -> float:
    """``ideal / measured`` (0.0 for an empty or instantaneous run)."""
    if measured <= 0:
        return 0.0
    return ideal / measured


@dataclass(frozen=True, slots=True)
class ModeResult:
    """One driver's numbers in one run."""

    mode: str
    trajectories: int
    completed: int
    turns: int
    generated_tokens: int
    makespan_s: float
    ideal_makespan_s: float
    client_cpu_s: float
    peak_rss_mb: float
    cached_tokens: int = 0
    prompt_tokens: int = 0
    tool_calls: int = 0
    """Calls the tool service answered during this mode (from its own log)."""
    note: str = ""
    services_cpu_s: float = 0.0
    """CPU the stand-in services (latency-model servers, tool service) used in this mode:
    on a small machine they share the cores with the client (0.0 where /proc is absent)."""

    @property
    def trajectories_per_s(self) -> float:
        return self.trajectories / self.makespan_s if self.makespan_s > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.makespan_s if self.makespan_s > 0 else 0.0

    @property
    def efficiency(self) -> float:
        return orchestration_efficiency(self.ideal_makespan_s, self.makespan_s)

    @property
    def cpu_per_turn_ms(self) -> float:
        return 1000.0 * self.client_cpu_s / self.turns if self.turns else 0.0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            trajectories_per_s=self.trajectories_per_s,
            tokens_per_s=self.tokens_per_s,
            efficiency=self.efficiency,
            cpu_per_turn_ms=self.cpu_per_turn_ms,
        )
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModeResult:
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in names})
