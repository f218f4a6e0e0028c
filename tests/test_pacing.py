"""Loop pacing (``toolrollout._pacing``): work that arrives together is spread over loop
iterations, so a timer due meanwhile fires between the pieces instead of after all of them.

The measure is a count, not a time: how many pieces of work had run when a timer that was
due from the start got to run. Each piece busy-waits 1 ms, half the pacing slice, so at
most a few fit in one iteration whatever the machine's load."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from toolrollout._pacing import SLICE_S, pace, pacing_statistics, set_pace_key, set_pacing

PIECES = 60


@pytest.fixture(autouse=True)
def _pacing_on() -> Iterator[None]:
    previous = set_pacing(True)
    yield
    set_pacing(previous)


def _busy(seconds: float) -> None:
    ends = time.perf_counter() + seconds
    while time.perf_counter() < ends:
        pass


async def _done_when_timer_fires(pieces: int) -> tuple[int, list[int]]:
    """Start ``pieces`` tasks at once, each ``await pace()`` then 1 ms of work, and a
    timer due at once; how many had worked when it fired, and the order they worked in."""
    loop = asyncio.get_running_loop()
    order: list[int] = []
    seen: list[int] = []
    fired = asyncio.Event()

    def timer() -> None:
        seen.append(len(order))
        fired.set()

    async def piece(index: int) -> None:
        await pace()
        _busy(SLICE_S / 2)
        order.append(index)

    tasks = [asyncio.ensure_future(piece(i)) for i in range(pieces)]
    loop.call_later(0.0, timer)
    await asyncio.gather(*tasks)
    await fired.wait()
    return seen[0], order


async def test_a_due_timer_runs_between_pieces_of_work_that_arrived_together() -> None:
    done, order = await _done_when_timer_fires(PIECES)
    # The first iteration runs the pieces its 2 ms slice holds; the timer comes next.
    assert done <= 4, f"{done} of {PIECES} pieces ran before a due timer"
    assert order == list(range(PIECES)), "queued work goes first come, first served"
    assert pacing_statistics().queued >= PIECES - 4


async def test_without_pacing_the_timer_waits_for_all_of_them() -> None:
    set_pacing(False)
    done, _ = await _done_when_timer_fires(PIECES)
    assert done == PIECES  # plain asyncio: the whole burst runs in one iteration


async def test_work_that_arrives_alone_is_not_delayed() -> None:
    before = pacing_statistics()
    for _ in range(20):
        await asyncio.sleep(0.003)  # a fresh iteration, with the last slice spent
        await pace()
    after = pacing_statistics()
    assert after.queued == before.queued
    assert after.passed == before.passed + 20


async def test_queued_work_goes_lowest_key_first_then_in_arrival_order() -> None:
    keys = [2, 0, 1, 0, 2, 1]
    order: list[tuple[int, int]] = []

    async def piece(index: int, key: int) -> None:
        set_pace_key(key)  # this task's context only
        await pace()
        _busy(SLICE_S)  # a whole slice: every later piece queues
        order.append((key, index))

    first = asyncio.ensure_future(piece(-1, 9))  # opens the slice and spends it
    tasks = [asyncio.ensure_future(piece(i, k)) for i, k in enumerate(keys)]
    await asyncio.wait_for(asyncio.gather(first, *tasks), 10)
    assert order[0] == (9, -1)
    assert order[1:] == sorted((k, i) for i, k in enumerate(keys))


async def test_a_cancelled_waiter_leaves_the_queue_and_the_rest_go_on() -> None:
    order: list[int] = []

    async def piece(index: int) -> None:
        await pace()
        _busy(SLICE_S)  # a whole slice: every later piece queues
        order.append(index)

    tasks = [asyncio.ensure_future(piece(i)) for i in range(6)]
    await asyncio.sleep(0)  # every task has run up to pace(); the first has worked
    assert pacing_statistics().waiting == 5
    tasks[2].cancel()
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
    assert isinstance(results[2], asyncio.CancelledError)
    assert order == [0, 1, 3, 4, 5]
    assert pacing_statistics().waiting == 0


def test_outside_a_loop_there_is_nothing_to_pace() -> None:
    stats = pacing_statistics()
    assert (stats.passed, stats.queued, stats.waiting) == (0, 0, 0)
