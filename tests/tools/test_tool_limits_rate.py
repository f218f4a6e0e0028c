"""Rate limit (aiolimiter underneath) and concurrency cap, as behavioural bounds."""

from __future__ import annotations

import time

import anyio
import pytest

from toolrollout._exceptions import UserError
from toolrollout.tools import (
    RateLimiter,
    ToolCallRequest,
    ToolExecutor,
    ToolLimits,
    function_tool,
)


async def test_50_calls_at_10_per_second_burst_1_take_4_9s_and_never_exceed_the_cap() -> None:
    # The one slow test (about 5.5 s): 50 starts spaced 0.1 s apart cannot take less than
    # 49 * 0.1 s, whatever the scheduler does. Each call runs 0.32 s, so at 10/s about 3.2
    # calls would run at once: without the cap 4 are reached; the cap of 3 must hold.
    cap, running, peak = 3, 0, 0
    starts: list[float] = []

    @function_tool(
        limits=ToolLimits(rate_limit=10, rate_burst=1, max_concurrency=cap, timeout=None)
    )
    async def probe(i: int) -> int:
        nonlocal running, peak
        starts.append(time.perf_counter())
        running += 1
        peak = max(peak, running)
        try:
            await anyio.sleep(0.32)
        finally:
            running -= 1
        return i

    executor = ToolExecutor([probe])
    began = time.perf_counter()
    results = await executor.run_calls([ToolCallRequest("probe", {"i": i}) for i in range(50)])
    elapsed = time.perf_counter() - began

    assert [r.text for r in results] == [str(i) for i in range(50)]
    assert elapsed >= 4.9, f"50 calls at 10/s finished in {elapsed:.2f}s"
    assert elapsed < 10, f"{elapsed:.2f}s: far slower than the rate allows"
    assert peak == cap, f"peak concurrency {peak}, cap {cap}"
    # the i-th start can come no sooner than i * 0.1 s after the first token, which itself
    # was handed out after `began` (a late first start must not make this flaky)
    early = [i for i, t in enumerate(sorted(starts)) if t - began < i * 0.1 - 1e-3]
    assert not early, f"calls {early} started earlier than 10/s allows"
    stats = executor.statistics().tools["probe"]
    assert stats.max_running == cap and stats.running == 0 and stats.in_flight == 0
    assert stats.rate_limiter is not None and stats.rate_limiter.acquired == 50
    assert stats.limiter.total_tokens == cap


async def test_burst_starts_at_once_then_the_rate_applies() -> None:
    starts: list[float] = []

    @function_tool(limits=ToolLimits(rate_limit=10, rate_burst=4))
    async def ping() -> str:
        starts.append(time.perf_counter())
        return "pong"

    began = time.perf_counter()
    await ToolExecutor([ping]).run_calls([ToolCallRequest("ping", {}) for _ in range(6)])
    offsets = sorted(t - began for t in starts)
    assert max(offsets[:4]) < 0.08, offsets  # the burst: no waiting
    assert offsets[4] >= 0.1 - 1e-3 and offsets[5] >= 0.2 - 1e-3, offsets


async def test_rate_limiter_statistics_track_the_bucket() -> None:
    limiter = RateLimiter(20, burst=3)
    full = limiter.statistics()
    assert (full.rate, full.burst, full.tokens_available, full.acquired) == (20.0, 3, 3.0, 0)
    for _ in range(3):
        await limiter.acquire()
    empty = limiter.statistics()
    assert empty.acquired == 3 and empty.tokens_available < 0.5

    async with anyio.create_task_group() as tg:
        tg.start_soon(limiter.acquire)
        await anyio.sleep(0.01)
        assert limiter.statistics().tasks_waiting == 1
    assert limiter.statistics().tasks_waiting == 0 and limiter.statistics().acquired == 4
    await anyio.sleep(0.1)  # refills 2 tokens at 20/s
    assert 1.5 <= limiter.statistics().tokens_available <= 3.0


async def test_a_waiter_cancelled_consumes_nothing() -> None:
    limiter = RateLimiter(5, burst=1)
    await limiter.acquire()
    with anyio.move_on_after(0.05):
        await limiter.acquire()  # would wait 0.2 s
    assert limiter.statistics().acquired == 1
    began = time.perf_counter()
    await limiter.acquire()  # the next token is still the one due 0.2 s after the first
    assert time.perf_counter() - began < 0.3  # not 0.4: no token was lost


@pytest.mark.parametrize(("rate", "burst"), [(0, 1), (-1, 1), (float("inf"), 1), (1, 0)])
def test_rate_limiter_rejects_bad_settings(rate: float, burst: int) -> None:
    with pytest.raises(UserError):
        RateLimiter(rate, burst=burst)
