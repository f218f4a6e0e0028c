"""Loop pacing: a turn's bulk work takes its turn across event-loop iterations.

Code about to do a turn's worth of CPU awaits :func:`pace` first: within the iteration's
slice (:data:`SLICE_S`) it goes on at once, otherwise it queues and the queue is let go one
task per iteration, lowest :func:`set_pace_key` first, then first come, first served. Why
and where: docs/scheduling.md#loop-pacing-work-that-lands-together-takes-turns.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
import weakref
from contextvars import ContextVar
from dataclasses import dataclass

__all__ = [
    "SLICE_S",
    "PacingStatistics",
    "pace",
    "pacing_statistics",
    "set_pace_key",
    "set_pacing",
]

SLICE_S = 0.002
"""How much work in one iteration lets further tasks go on without queueing. Small against
the 10 ms a timer may be late, large against one turn's piece of work (0.1 to 1 ms)."""

_enabled = True

_pace_key: ContextVar[int] = ContextVar("toolrollout_pace_key", default=0)


def set_pace_key(key: int) -> None:
    """Where the calling task's queued work goes among other queued work: lower first.

    A context variable: it holds for the task that sets it and the tasks it starts. The
    rollout loop sets a trajectory's GRPO group rank here under the ``oldest`` policy, so
    the groups that started first keep moving when the loop is busy."""
    _pace_key.set(key)


def set_pacing(enabled: bool) -> bool:
    """Turn pacing on or off for the process (on by default); returns the previous setting.

    Off, :func:`pace` returns at once: every ready task does its work in the same iteration,
    as plain asyncio does. For measuring what pacing changes (``toolrollout bench`` mode
    ``toolrollout:unpaced``)."""
    global _enabled
    previous, _enabled = _enabled, enabled
    return previous


@dataclass(frozen=True, slots=True)
class PacingStatistics:
    """What the running loop's pacer has done so far."""

    passed: int
    """Calls to :func:`pace` that went on at once."""
    queued: int
    """Calls that waited for a later iteration."""
    waiting: int
    """Tasks waiting now."""


class _Pacer:
    __slots__ = ("_arrivals", "_loop", "_queue", "_slice_ends", "_turning", "passed", "queued")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: list[tuple[int, int, asyncio.Future[None]]] = []
        """A heap of (key, arrival, waiter)."""
        self._arrivals = itertools.count()
        self._slice_ends = 0.0
        """perf_counter time at which this iteration's slice is spent."""
        self._turning = False
        """Whether :meth:`_next_iteration` sits in the loop's ready queue."""
        self.passed = 0
        self.queued = 0

    async def turn(self) -> None:
        if not self._queue:
            now = time.perf_counter()
            if not self._turning:  # the first work of this iteration opens its slice
                self._open_slice(now)
                self.passed += 1
                return
            if now < self._slice_ends:
                self.passed += 1
                return
        self.queued += 1
        waiter = self._loop.create_future()
        heapq.heappush(self._queue, (_pace_key.get(), next(self._arrivals), waiter))
        await waiter

    def _open_slice(self, now: float) -> None:
        self._slice_ends = now + SLICE_S
        self._turning = True
        # Scheduled now, it runs in the next iteration: after the timers, after the I/O.
        self._loop.call_soon(self._next_iteration)

    def _next_iteration(self) -> None:
        self._turning = False
        queue = self._queue
        while queue:
            _, _, waiter = heapq.heappop(queue)
            if not waiter.done():  # a cancelled waiter has left
                waiter.set_result(None)
                self._open_slice(time.perf_counter())
                return

    def statistics(self) -> PacingStatistics:
        waiting = sum(1 for _, _, waiter in self._queue if not waiter.done())
        return PacingStatistics(passed=self.passed, queued=self.queued, waiting=waiting)


_pacers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Pacer] = weakref.WeakKeyDictionary()


def _pacer() -> _Pacer | None:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # not on asyncio (trio, or no loop): nothing to pace
        return None
    pacer = _pacers.get(loop)
    if pacer is None:
        pacer = _pacers[loop] = _Pacer(loop)
    return pacer


async def pace() -> None:
    """Wait, if this loop iteration's slice is spent, for a later one (see the module)."""
    if not _enabled:
        return
    pacer = _pacer()
    if pacer is not None:
        await pacer.turn()


def pacing_statistics() -> PacingStatistics:
    """The running loop's pacing so far (zeros where nothing was paced)."""
    pacer = _pacer()
    if pacer is None:
        return PacingStatistics(passed=0, queued=0, waiting=0)
    return pacer.statistics()
