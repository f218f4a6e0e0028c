"""The global batch target of a sharded run, without Ray: the coordinator's rule, and the
runner's outside stop (``run_batch(until=...)``) and ``skip`` that a shard worker uses.

The engine is the documented test seam (``toolrollout.testing.ScriptedEngine``, which
honours ``abort`` as SGLang does); the Ray run itself is in ``test_ray_generate.py``.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from toolrollout._exceptions import UserError
from toolrollout.apps.demo import DEMO_MODEL_PATH
from toolrollout.apps.distributed import BatchCoordinator
from toolrollout.engines import GenerateRequest
from toolrollout.rollout import RolloutConfig, RolloutRunner, TrajectoryStatus
from toolrollout.testing import ScriptedEngine, ScriptedOutput
from toolrollout.tools import calculator_tool

PROMPT = [{"role": "user", "content": "What is 2 + 3?"}]
ANSWER = "The answer is 5.<|im_end|>"


def test_whole_groups_from_any_shard_first_come_first_in() -> None:
    coordinator = BatchCoordinator(target_groups=2, n=2)
    assert not coordinator.report([("a", 0), ("b", 0), ("b", 0)])  # repeats count once
    assert not coordinator.report([("c", 1), ("b", 1)])  # b complete: 1 group of 2
    assert not coordinator.stopped()
    assert coordinator.report([("c", 0)])  # c complete (another shard): target met
    assert coordinator.stopped()
    assert coordinator.report([("a", 1)])  # still stopped, and a is not taken in
    assert coordinator.chosen() == [("b", 0), ("b", 1), ("c", 0), ("c", 1)]  # a came too late


def test_samples_from_any_groups_when_groups_need_not_stay_whole() -> None:
    coordinator = BatchCoordinator(target_groups=1, n=2, keep_groups_whole=False)
    assert not coordinator.report([("a", 1)])
    assert coordinator.report([("b", 0), ("c", 0)])
    assert coordinator.chosen() == [("a", 1), ("b", 0)]
    unmet = BatchCoordinator(target_groups=2, n=2, keep_groups_whole=False)
    unmet.report([("a", 0)])
    assert unmet.chosen() == [("a", 0)]  # a run that ended short keeps what finished
    with pytest.raises(UserError):
        BatchCoordinator(target_groups=0, n=2)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(DEMO_MODEL_PATH))


async def test_an_outside_stop_aborts_the_shards_batch(tokenizer: Any) -> None:
    """What a worker does when another shard met the target: set ``until``. Its requests
    in flight are aborted by rid, the cut trajectories keep tokens and resume points, and
    the samples of other shards (``skip``) are never run."""
    answer = list(tokenizer.encode(ANSWER, add_special_tokens=False))

    def script(request: GenerateRequest) -> ScriptedOutput:
        if request.session_id == "g1-0":
            return ScriptedOutput(answer, logprobs=[-0.2] * len(answer))
        return ScriptedOutput(answer, logprobs=[-0.2] * len(answer), delay=60.0, abort_after=3)

    engine = ScriptedEngine(script)
    runner = RolloutRunner(engine, tokenizer, [calculator_tool()], config=RolloutConfig(n=2))
    until = anyio.Event()
    seen: list[str] = []

    def on_result(trajectory: Any) -> None:
        seen.append(trajectory.uid)
        if trajectory.uid == "g1-0":
            until.set()  # as if the coordinator said stop now

    with anyio.fail_after(20):  # the slow answers would take a minute without the aborts
        batch = await runner.run_batch(
            [PROMPT] * 3,
            target_groups=2,  # both groups of this shard: only the outside stop ends it early
            group_ids=["g0", "g1", "g2"],
            skip={(0, 0), (0, 1)},  # prompt 0 belongs to another shard
            on_result=on_result,
            until=until,
        )
    assert not any(uid.startswith("g0") for uid in seen)
    assert batch.trajectories == ()  # no group of this shard was complete at the stop
    assert sorted(t.uid for t in batch.leftover) == ["g1-0", "g1-1", "g2-0", "g2-1"]
    assert sorted(t.uid for t in batch.partial) == ["g1-1", "g2-0", "g2-1"]
    slow = [str(r.rid) for r in engine.requests if r.session_id != "g1-0"]
    assert sorted(engine.aborted) == sorted(slow)
    for t in batch.partial:
        assert t.resume_point is not None and t.response_ids == answer[:3]
    assert next(t for t in batch.leftover if t.uid == "g1-0").status is (TrajectoryStatus.COMPLETED)


async def test_an_outside_stop_never_set_does_not_hold_the_batch(tokenizer: Any) -> None:
    answer = list(tokenizer.encode(ANSWER, add_special_tokens=False))
    engine = ScriptedEngine(lambda _: ScriptedOutput(answer, logprobs=[-0.2] * len(answer)))
    runner = RolloutRunner(engine, tokenizer, [calculator_tool()], config=RolloutConfig(n=2))
    with anyio.fail_after(20):
        batch = await runner.run_batch(
            [PROMPT] * 2, target_groups=2, group_ids=["g0", "g1"], until=anyio.Event()
        )
    assert len(batch.trajectories) == 4 and batch.leftover == ()
