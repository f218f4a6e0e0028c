"""The ``admission`` and ``lag`` scheduling policies: an AIMD limit on the requests in flight
(see :mod:`._scheduling`)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import anyio

from ._scheduling_config import SchedulingConfig

__all__ = ["LAG_TICK_S", "AdmissionControl", "LagAdmission"]


class _Aimd:
    """A limit on the requests in flight, between ``admission_min`` and the run's
    concurrency: cut by 0.7x when a signal says back off, raised by ``admission_step``
    when it says there is room (additive increase, multiplicative decrease)."""

    def __init__(self, config: SchedulingConfig, ceiling: int) -> None:
        self.config = config
        self.ceiling = max(ceiling, config.admission_min)
        self.limit = self.ceiling
        self.history: list[tuple[float, int]] = []
        """(monotonic time, limit) after each update, to plot or check."""

    def _step(self, *, back_off: bool, grow: bool) -> int:
        if back_off:
            self.limit = max(self.config.admission_min, int(self.limit * 0.7))
        elif grow:
            self.limit = min(self.ceiling, self.limit + self.config.admission_step)
        self.history.append((time.monotonic(), self.limit))
        return self.limit


class AdmissionControl(_Aimd):
    """AIMD on the number of requests in flight, driven by the servers' load report."""

    def update(self, loads: Sequence[dict[str, Any]]) -> int:
        """The new limit for one round of load reports (one per server, DP rank)."""
        if not loads:
            return self.limit
        usage = max(float(load.get("token_usage") or 0.0) for load in loads)
        waiting = sum(int(load.get("num_waiting_reqs") or 0) for load in loads)
        retracted = sum(int((load.get("queues") or {}).get("retracted") or 0) for load in loads)
        return self._step(
            back_off=usage > self.config.kv_target or retracted > 0,
            grow=waiting == 0 or usage < self.config.kv_target * 0.8,
        )


LAG_TICK_S = 0.01
"""The ``lag`` policy's probe: a sleep this long, and how late it wakes."""


class LagAdmission(_Aimd):
    """AIMD on the number of requests in flight, driven by the client's event-loop lag."""

    def __init__(self, config: SchedulingConfig, ceiling: int) -> None:
        super().__init__(config, ceiling)
        self.late_ms: list[float] = []
        """Each window's median lateness, in milliseconds."""

    def update(self, late_s: float) -> int:
        """The new limit after a window whose median wake-up was ``late_s`` late.

        The median, not the worst: backing off for each single stall cost two thirds of the
        throughput (docs/scheduling.md)."""
        target = self.config.lag_target_ms / 1000.0
        self.late_ms.append(late_s * 1000.0)
        return self._step(back_off=late_s > target, grow=late_s < target / 2)

    async def watch(self, apply: Callable[[], None]) -> None:
        """Probe the loop until cancelled; after each window, ``apply`` the limits."""
        window = self.config.poll_s
        late: list[float] = []
        ends = anyio.current_time() + window
        while True:
            before = anyio.current_time()
            await anyio.sleep(LAG_TICK_S)
            now = anyio.current_time()
            late.append(now - before - LAG_TICK_S)
            if now >= ends:
                self.update(statistics.median(late))
                apply()
                late, ends = [], now + window
