"""Rate limit (aiolimiter underneath) and concurrency cap, on a virtual clock.

The event loop's clock only moves to the next due timer (tests/_virtual_time.py), so the
schedules below are exact and independent of how busy the machine is.
"""

from __future__ import annotations

import asyncio
import itertools

import anyio
import pytest
from tests._virtual_time import run_in_virtual_time

from toolrollout._exceptions import UserError
from toolrollout.tools import ToolCallRequest, ToolExecutor, ToolLimits, ToolResult, function_tool
from toolrollout.tools._executor import ToolStatistics
from toolrollout.tools._limits import RateLimiter


def loop_time() -> float:
    return asyncio.get_running_loop().time()


def test_50_calls_at_10_per_second_burst_1_take_4_9s_and_never_exceed_the_cap() -> None:
    # 50 starts spaced 0.1 s apart cannot take less than 49 * 0.1 s. Each call runs 0.32 s,
    # so at 10/s about 3.2 calls would run at once: without the cap 4 are reached; the cap
    # of 3 must hold. On the virtual clock the schedule is exact and takes no wall time.
    cap, running, peak = 3, 0, 0
    starts: list[float] = []

    @function_tool(
        limits=ToolLimits(rate_limit=10, rate_burst=1, max_concurrency=cap, timeout=None)
    )
    async def probe(i: int) -> int:
        nonlocal running, peak
        starts.append(loop_time())
        running += 1
        peak = max(peak, running)
        try:
            await anyio.sleep(0.32)
        finally:
            running -= 1
        return i

    async def main() -> tuple[ToolStatistics, list[ToolResult], float]:
        executor = ToolExecutor([probe], clock=loop_time)
        began = loop_time()
        results = await executor.run_calls([ToolCallRequest("probe", {"i": i}) for i in range(50)])
        return executor.statistics().tools["probe"], results, loop_time() - began

    stats, results, elapsed = run_in_virtual_time(main)

    assert [r.text for r in results] == [str(i) for i in range(50)]
    assert elapsed >= 49 * 0.1 + 0.32 - 1e-9, f"50 calls at 10/s finished in {elapsed:.3f}s"
    # the cap makes it a little slower than the rate alone: 3 slots of 0.32 s free a slot
    # every 0.107 s on average, so 50 calls need about 50 * 0.32 / 3 = 5.33 s, not 10
    assert elapsed < 50 * 0.32 / 3 + 0.5, f"{elapsed:.3f}s: slower than rate and cap allow"
    assert peak == cap, f"peak concurrency {peak}, cap {cap}"
    gaps = [b - a for a, b in itertools.pairwise(sorted(starts))]
    assert min(gaps) >= 0.1 - 1e-9, f"two calls started {min(gaps):.3f}s apart at 10/s"
    assert stats.max_running == cap and stats.running == 0 and stats.in_flight == 0
    assert stats.rate_limiter is not None and stats.rate_limiter.acquired == 50
    assert stats.limiter.total_tokens == cap


def test_burst_starts_at_once_then_the_rate_applies() -> None:
    starts: list[float] = []

    @function_tool(limits=ToolLimits(rate_limit=10, rate_burst=4))
    async def ping() -> str:
        starts.append(loop_time())
        return "pong"

    async def main() -> None:
        await ToolExecutor([ping], clock=loop_time).run_calls(
            [ToolCallRequest("ping", {}) for _ in range(6)]
        )

    run_in_virtual_time(main)
    # the burst passes without waiting; then one token every 0.1 s
    assert sorted(starts) == pytest.approx([0.0, 0.0, 0.0, 0.0, 0.1, 0.2])


def test_rate_limiter_statistics_track_the_bucket() -> None:
    async def main() -> None:
        limiter = RateLimiter(20, burst=3, clock=loop_time)
        full = limiter.statistics()
        assert (full.rate, full.burst, full.tokens_available, full.acquired) == (20.0, 3, 3.0, 0)
        for _ in range(3):
            await limiter.acquire()
        empty = limiter.statistics()
        assert empty.acquired == 3 and empty.tokens_available == 0.0

        async with anyio.create_task_group() as tg:
            tg.start_soon(limiter.acquire)
            # the clock moves only once the waiter is parked in the limiter, so this is
            # ordering, not a guess at how long the start takes
            await anyio.sleep(0.01)
            assert limiter.statistics().tasks_waiting == 1
        assert loop_time() == pytest.approx(1 / 20)  # the fourth token came after 50 ms
        assert limiter.statistics().tasks_waiting == 0 and limiter.statistics().acquired == 4
        await anyio.sleep(0.1)  # refills 2 tokens at 20/s
        assert limiter.statistics().tokens_available == pytest.approx(2.0)

    run_in_virtual_time(main)


def test_a_waiter_cancelled_consumes_nothing() -> None:
    async def main() -> None:
        limiter = RateLimiter(5, burst=1, clock=loop_time)
        await limiter.acquire()
        with anyio.move_on_after(0.05):
            await limiter.acquire()  # would wait 0.2 s
        assert limiter.statistics().acquired == 1 and loop_time() == pytest.approx(0.05)
        await limiter.acquire()
        # the next token is still the one due 0.2 s after the first (not 0.25 s or 0.4 s:
        # the cancelled waiter neither kept nor lost one)
        assert loop_time() == pytest.approx(0.2)
        assert limiter.statistics().acquired == 2

    run_in_virtual_time(main)


@pytest.mark.parametrize(("rate", "burst"), [(0, 1), (-1, 1), (float("inf"), 1), (1, 0)])
def test_rate_limiter_rejects_bad_settings(rate: float, burst: int) -> None:
    with pytest.raises(UserError):
        RateLimiter(rate, burst=burst)
