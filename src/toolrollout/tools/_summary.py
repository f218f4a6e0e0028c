"""Per-tool numbers of a set of tool calls (one trajectory's, say)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from ._types import ToolResult

__all__ = ["CallRecord", "ToolCallSummary", "summarize_call_records", "summarize_tool_calls"]


@dataclass(frozen=True, slots=True)
class ToolCallSummary:
    """Per-tool numbers of a set of calls (e.g. one trajectory's), from their results."""

    calls: int = 0
    """Calls made (results received), errors included."""
    errors: int = 0
    """Error results (``is_error``), whatever the kind."""
    retries: int = 0
    """Sum of ``ToolResult.retries``."""
    timeouts: int = 0
    """Results whose ``error_kind`` is ``ToolTimeout``."""
    circuit_open: int = 0
    """Results failed fast by an open circuit breaker (``error_kind`` ``CircuitOpen``)."""
    seconds: float = 0.0
    """Sum of ``ToolResult.seconds``."""
    max_seconds: float = 0.0
    """Largest ``ToolResult.seconds``."""
    error_kinds: Mapping[str, int] = field(default_factory=dict)
    """Error results by ``error_kind``; an ``is_error`` result the tool wrote itself (no
    exception) counts as ``"ToolReportedError"``."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, for trajectory metrics."""
        return {f.name: getattr(self, f.name) for f in fields(self)} | {
            "seconds": round(self.seconds, 6),
            "max_seconds": round(self.max_seconds, 6),
            "error_kinds": dict(sorted(self.error_kinds.items())),
        }


def summarize_tool_calls(
    records: Iterable[tuple[str, ToolResult]],
) -> dict[str, ToolCallSummary]:
    """Aggregate ``(tool name, result)`` pairs into one :class:`ToolCallSummary` per name."""
    return summarize_call_records(
        (name, r.seconds, r.attempts, r.is_error, r.error_kind) for name, r in records
    )


CallRecord = tuple[str, float, int, bool, str | None]
"""(tool name, seconds, attempts, is_error, error kind): atomic values only, so the garbage
collector stops tracking the tuple (it walks every live trajectory on each collection)."""


def summarize_call_records(records: Iterable[CallRecord]) -> dict[str, ToolCallSummary]:
    """:func:`summarize_tool_calls` over :data:`CallRecord` tuples."""
    grouped: dict[str, list[CallRecord]] = {}
    for record in records:
        grouped.setdefault(record[0], []).append(record)
    summaries: dict[str, ToolCallSummary] = {}
    for name, calls in grouped.items():
        kinds = Counter(kind or "ToolReportedError" for _, _, _, err, kind in calls if err)
        summaries[name] = ToolCallSummary(
            calls=len(calls),
            errors=sum(err for _, _, _, err, _ in calls),
            retries=sum(max(attempts - 1, 0) for _, _, attempts, _, _ in calls),
            timeouts=kinds.get("ToolTimeout", 0),
            circuit_open=kinds.get("CircuitOpen", 0),
            seconds=sum(seconds for _, seconds, _, _, _ in calls),
            max_seconds=max(seconds for _, seconds, _, _, _ in calls),
            error_kinds=MappingProxyType(dict(kinds)),
        )
    return summaries
