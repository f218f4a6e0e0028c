"""An asyncio loop on a virtual clock: timers fire in order, at once, with exact times.

When every task waits on a timer, the loop's selector moves the clock to the next timer
instead of sleeping, so ``anyio.sleep``, ``move_on_after``, aiolimiter's waits and retry
backoffs take no wall time, and ``loop.time()`` reads exactly what the schedule says. A
starved CI runner cannot change the outcome.

Only for code that waits on timers and the loop itself: a thread working in the
background (``anyio.to_thread``) is not waited for while a timer is pending, so the clock
would jump past it.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import FileDescriptorLike

__all__ = ["VirtualTimeLoop", "run_in_virtual_time"]

T = TypeVar("T")
_MIN_STEP = 1e-9


class _VirtualSelector(selectors.BaseSelector):
    """Real I/O readiness; a wait with a timeout advances the loop's clock instead."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        self._real = selectors.DefaultSelector()
        self._loop = loop

    def register(
        self, fileobj: FileDescriptorLike, events: int, data: Any = None
    ) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: FileDescriptorLike) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(
        self, fileobj: FileDescriptorLike, events: int, data: Any = None
    ) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._real.select(0)
        if ready:
            return ready
        if timeout is None:  # no timer pending: only I/O or another thread can wake the loop
            return self._real.select(None)
        if (
            timeout <= 0 and self._loop.has_ready_callbacks()
        ):  # callbacks to run first: the clock stands
            return []
        # The next timer is due: move to it, by at least a nanosecond. A timer rescheduled
        # for "now" (aiolimiter's leak does so after a float rounding) would otherwise spin
        # at a clock that never moves; a real clock always moves a little.
        self._loop._advance(max(timeout, _MIN_STEP))
        return []

    def get_map(self) -> Mapping[FileDescriptorLike, selectors.SelectorKey]:
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose ``time()`` starts at 0.0 and moves only to due timers."""

    def __init__(self) -> None:
        self._virtual_now = 0.0
        super().__init__(_VirtualSelector(self))

    def has_ready_callbacks(self) -> bool:
        """Whether callbacks wait to run in this iteration (asyncio's own queue)."""
        return bool(self._ready)  # type: ignore[attr-defined]

    def _advance(self, seconds: float) -> None:
        self._virtual_now += seconds

    def time(self) -> float:
        return self._virtual_now


def run_in_virtual_time(main: Callable[[], Awaitable[T]]) -> T:
    """Run ``main()`` to completion on a fresh :class:`VirtualTimeLoop`."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(_as_coroutine(main))


async def _as_coroutine(main: Callable[[], Awaitable[T]]) -> T:
    return await main()
