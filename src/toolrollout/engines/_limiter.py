"""The run's limit on requests in flight, with waiters served in an order the caller picks.

anyio's ``CapacityLimiter`` is first come, first served, so trajectories queue behind each
other at every turn and all GRPO groups complete near the end. :class:`OrderedLimiter`
grants a freed slot to the smallest key instead (the ``oldest`` policy keys by group).
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

import anyio

__all__ = ["LimiterStatistics", "OrderedLimiter"]


@dataclass(frozen=True, slots=True)
class LimiterStatistics:
    """A snapshot of an :class:`OrderedLimiter`."""

    total_tokens: int
    borrowed_tokens: int
    waiting: int
    """Acquirers waiting for a slot now."""
    waits: int
    """Acquisitions so far that had to wait for a slot (the rest found one free)."""


class _Waiter:
    __slots__ = ("event", "gone", "granted")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.granted = False
        self.gone = False


class _Slot:
    """``async with limiter.ordered(key)``: one slot, granted in key order."""

    __slots__ = ("_key", "_limiter")

    def __init__(self, limiter: OrderedLimiter, key: int) -> None:
        self._limiter = limiter
        self._key = key

    async def __aenter__(self) -> None:
        await self._limiter.acquire(self._key)

    async def __aexit__(self, *exc_info: object) -> None:
        self._limiter.release()


class OrderedLimiter:
    """At most ``total_tokens`` borrowers at once; a freed slot goes to the waiter with the
    smallest key, and among equal keys to the one that came first.

    ``async with limiter`` borrows with key 0. ``total_tokens`` may change during the run:
    raising it wakes waiters, lowering it lets the borrowers in flight finish.
    """

    def __init__(self, total_tokens: int) -> None:
        self._total = self._checked(total_tokens)
        self._borrowed = 0
        self._heap: list[tuple[int, int, _Waiter]] = []
        self._arrivals = itertools.count()
        self._waiting = 0
        self._waits = 0

    @staticmethod
    def _checked(total: int) -> int:
        if isinstance(total, bool) or not isinstance(total, int) or total < 1:
            raise ValueError(f"total_tokens must be an int of at least 1, got {total!r}")
        return total

    @property
    def total_tokens(self) -> int:
        return self._total

    @total_tokens.setter
    def total_tokens(self, value: int) -> None:
        self._total = self._checked(value)
        self._grant()

    @property
    def borrowed_tokens(self) -> int:
        return self._borrowed

    @property
    def available_tokens(self) -> int:
        return max(self._total - self._borrowed, 0)

    def statistics(self) -> LimiterStatistics:
        return LimiterStatistics(self._total, self._borrowed, self._waiting, self._waits)

    def ordered(self, key: int) -> _Slot:
        """A context manager borrowing one slot in the order of ``key`` (smaller first)."""
        return _Slot(self, key)

    async def acquire(self, key: int = 0) -> None:
        """Borrow one slot, waiting behind every waiter with a smaller key."""
        if not self._waiting and self._borrowed < self._total:
            self._borrowed += 1
            return
        waiter = _Waiter()
        heapq.heappush(self._heap, (key, next(self._arrivals), waiter))
        self._waiting += 1
        self._waits += 1
        try:
            await waiter.event.wait()
        except BaseException:
            if waiter.granted:  # granted as it was cancelled: hand the slot on
                self.release()
            else:
                waiter.gone = True
                self._waiting -= 1
            raise

    def release(self) -> None:
        """Give one slot back; the first waiter in key order gets it."""
        if self._borrowed < 1:
            raise RuntimeError("release() without a slot borrowed")
        self._borrowed -= 1
        self._grant()

    def _grant(self) -> None:
        while self._heap and self._borrowed < self._total:
            waiter = heapq.heappop(self._heap)[2]
            if waiter.gone:
                continue
            waiter.granted = True
            self._waiting -= 1
            self._borrowed += 1
            waiter.event.set()

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *exc_info: object) -> None:
        self.release()
