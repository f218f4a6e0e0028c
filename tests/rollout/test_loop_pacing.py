"""Trajectories started together render their prompts over many loop iterations, not one.

A timer re-armed at every firing counts the engine requests made between two firings: the
work one loop iteration did between two looks at its timers. The runner starts
trajectories :data:`START_BATCH` at a time; unpaced, every trajectory of such a batch
renders its prompt and sends its first request in the same iteration."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from toolrollout import RolloutConfig, RolloutRunner, _pacing
from toolrollout._pacing import _pace_key
from toolrollout._records import TrajectoryStatus
from toolrollout.engines import GenerateRequest, SchedulingConfig
from toolrollout.rollout import set_pacing
from toolrollout.rollout._batch import START_BATCH
from toolrollout.testing import ScriptedEngine

TRAJECTORIES = 200


@pytest.fixture
def pacing() -> Iterator[None]:
    previous = set_pacing(True)
    yield
    set_pacing(previous)


async def _most_requests_between_two_timer_firings(demo_tokenizer: Any) -> int:
    answer = demo_tokenizer.encode("It is 5.<|im_end|>", add_special_tokens=False)
    engine = ScriptedEngine([answer] * TRAJECTORIES)
    runner = RolloutRunner(engine, demo_tokenizer, [])
    loop = asyncio.get_running_loop()
    counts: list[int] = []
    handle: asyncio.TimerHandle | None = None

    def tick() -> None:
        nonlocal handle
        counts.append(len(engine.requests))
        handle = loop.call_later(0.0, tick)

    tick()
    try:
        rows = [
            {"messages": [{"role": "user", "content": f"{i} + 3?"}]} for i in range(TRAJECTORIES)
        ]
        trajectories = await runner.run(rows)
    finally:
        assert handle is not None
        handle.cancel()
    assert all(t.status is TrajectoryStatus.COMPLETED for t in trajectories)
    assert counts[-1] == TRAJECTORIES
    return max(b - a for a, b in itertools.pairwise(counts))


async def test_the_first_requests_of_a_batch_spread_over_iterations(
    demo_tokenizer: Any, pacing: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With no slice, one piece of paced work goes per iteration however fast the machine
    # renders a prompt: the count is a property of the loop, not of the clock (with the
    # 2 ms slice, a fast machine fits more renders in one iteration than a loaded one).
    monkeypatch.setattr(_pacing, "SLICE_S", 0.0)
    most = await _most_requests_between_two_timer_firings(demo_tokenizer)
    assert most <= 2, f"{most} prompts rendered between two timer firings"


async def test_unpaced_they_all_go_in_one_iteration(demo_tokenizer: Any, pacing: None) -> None:
    set_pacing(False)
    most = await _most_requests_between_two_timer_firings(demo_tokenizer)
    assert most == START_BATCH


async def test_under_oldest_a_trajectory_paces_with_its_group_rank(
    demo_tokenizer: Any, pacing: None
) -> None:
    """With ``oldest`` the loop's busy moments serve the groups that started first: the
    key the engine's caller paces with is its group's rank."""
    answer: list[int] = demo_tokenizer.encode("It is 5.<|im_end|>", add_special_tokens=False)
    keys: dict[str, int] = {}

    def reply(request: GenerateRequest) -> list[int]:
        keys[request.session_id or ""] = _pace_key.get()
        return answer

    config = RolloutConfig(n=2, scheduling=SchedulingConfig(oldest=True))
    runner = RolloutRunner(ScriptedEngine(reply), demo_tokenizer, [], config=config)
    rows = [{"messages": [{"role": "user", "content": f"{i} + 3?"}]} for i in range(3)]
    trajectories = await runner.run(rows)
    by_prompt = {t.uid: t.prompt_index for t in trajectories}
    assert sorted((by_prompt[uid], key) for uid, key in keys.items()) == [
        (0, 0), (0, 0), (1, 1), (1, 1), (2, 2), (2, 2),
    ]  # fmt: skip
