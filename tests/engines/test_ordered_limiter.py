"""The run's limit on requests in flight (``OrderedLimiter``): key order, arrival order
among equal keys, limits changed mid-run, and waiters cancelled at either moment."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest

from toolrollout.engines._limiter import OrderedLimiter


async def _waiting_in_order(limiter: OrderedLimiter, keys: list[int]) -> list[int]:
    """Queue one acquirer per key (in list order) behind a full limiter, then free the
    slot one release at a time; the keys in the order they were granted."""
    granted: list[int] = []

    async def borrower(key: int) -> None:
        await limiter.acquire(key)
        granted.append(key)

    await limiter.acquire()  # the only slot: everyone below waits
    async with anyio.create_task_group() as tg:
        for key in keys:
            tg.start_soon(borrower, key)
            await anyio.wait_all_tasks_blocked()
        assert limiter.statistics().waiting == len(keys)
        limiter.release()
        for _ in keys:
            await anyio.wait_all_tasks_blocked()
            limiter.release()
    return granted


async def test_a_freed_slot_goes_to_the_smallest_key_then_to_the_first_come() -> None:
    limiter = OrderedLimiter(1)
    granted = await _waiting_in_order(limiter, [5, 2, 9, 2, 0])
    assert granted == [0, 2, 2, 5, 9]
    stats = limiter.statistics()
    assert (stats.borrowed_tokens, stats.waiting, stats.waits) == (0, 0, 5)


async def test_without_keys_it_is_first_come_first_served() -> None:
    limiter = OrderedLimiter(1)
    order: list[str] = []

    async def borrower(name: str) -> None:
        async with limiter:
            order.append(name)
            await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        for name in "abcde":
            tg.start_soon(borrower, name)
    assert order == list("abcde")


async def test_raising_the_limit_wakes_waiters_and_lowering_it_lets_borrowers_finish() -> None:
    limiter = OrderedLimiter(1)
    inside = 0
    most = 0
    go = anyio.Event()

    async def borrower() -> None:
        nonlocal inside, most
        async with limiter:
            inside += 1
            most = max(most, inside)
            await go.wait()
            inside -= 1

    async with anyio.create_task_group() as tg:
        for _ in range(6):
            tg.start_soon(borrower)
        await anyio.wait_all_tasks_blocked()
        assert inside == 1
        limiter.total_tokens = 4  # three waiters get in at once
        await anyio.wait_all_tasks_blocked()
        assert inside == 4 and limiter.available_tokens == 0
        limiter.total_tokens = 2  # nobody is thrown out; nobody new gets in
        await anyio.wait_all_tasks_blocked()
        assert inside == 4 and limiter.statistics().waiting == 2
        go.set()
    assert most == 4 and limiter.borrowed_tokens == 0


async def test_a_cancelled_waiter_is_skipped_and_a_slot_granted_while_cancelled_goes_on() -> None:
    limiter = OrderedLimiter(1)
    granted: list[str] = []

    async def borrower(name: str, scope_out: list[anyio.CancelScope]) -> None:
        with anyio.CancelScope() as scope:
            scope_out.append(scope)
            await limiter.acquire()
            granted.append(name)
            limiter.release()

    await limiter.acquire()
    scopes: list[anyio.CancelScope] = []
    with anyio.fail_after(10):  # a lost slot would leave "last" waiting forever
        await _cancel_two_of_three(limiter, borrower, scopes)
    assert granted == ["last"]
    assert limiter.borrowed_tokens == 0 and limiter.statistics().waiting == 0


async def _cancel_two_of_three(
    limiter: OrderedLimiter, borrower: Any, scopes: list[anyio.CancelScope]
) -> None:
    async with anyio.create_task_group() as tg:
        for name in ("gone", "granted-then-cancelled", "last"):
            tg.start_soon(borrower, name, scopes)
            await anyio.wait_all_tasks_blocked()
        scopes[0].cancel()  # cancelled while waiting: skipped
        await anyio.wait_all_tasks_blocked()
        assert limiter.statistics().waiting == 2
        scopes[1].cancel()  # cancelled, but it has not run yet...
        limiter.release()  # ...when the slot is granted to it: the slot goes on


def test_bad_limits_and_stray_releases_are_refused() -> None:
    with pytest.raises(ValueError, match="total_tokens must be an int of at least 1, got 0"):
        OrderedLimiter(0)
    limiter = OrderedLimiter(2)
    with pytest.raises(ValueError, match=r"got 1\.5"):
        limiter.total_tokens = 1.5  # type: ignore[assignment]
    with pytest.raises(RuntimeError, match="without a slot borrowed"):
        limiter.release()
