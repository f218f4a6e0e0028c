"""Straggler control, partial rollouts and the deferred drift check, on a scripted engine.

The engine is the documented test seam (``toolrollout.testing.ScriptedEngine``, which
honours ``abort`` the way SGLang does); the tokenizer, chat template, tools and drift check
are the real ones. The same features against the real server: ``test_stragglers_e2e.py``.
"""

from __future__ import annotations

import pickle
from typing import Any

import anyio
import pytest

from toolrollout._exceptions import UserError
from toolrollout.chat import check_drift
from toolrollout.engines import FinishReason, GenerateRequest, SamplingParams
from toolrollout.rollout import RolloutConfig, RolloutRunner, Trajectory, TrajectoryStatus
from toolrollout.testing import ScriptedEngine, ScriptedOutput
from toolrollout.tools import calculator_tool

PROMPT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is 2 + 3?"},
]
ANSWER = "The answer is 5.<|im_end|>"
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 3"}}\n</tool_call>'


def ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def out(tokenizer: Any, text: str, **kwargs: Any) -> ScriptedOutput:
    tokens = ids(tokenizer, text)
    return ScriptedOutput(tokens, logprobs=[-0.25] * len(tokens), **kwargs)


def slow(tokenizer: Any, text: str, keep: int) -> ScriptedOutput:
    """An answer that takes a minute unless aborted; then ``keep`` ids count as generated."""
    return out(tokenizer, text, delay=60.0, abort_after=keep)


def runner(engine: ScriptedEngine, tokenizer: Any, **config: Any) -> RolloutRunner:
    return RolloutRunner(
        engine, tokenizer, [calculator_tool()], config=RolloutConfig(**{"n": 2, **config})
    )


def by_uid(trajectories: tuple[Trajectory, ...]) -> dict[str, Trajectory]:
    return {t.uid: t for t in trajectories}


async def test_oversampling_stops_at_the_target_and_aborts_the_rest(demo_tokenizer: Any) -> None:
    def script(request: GenerateRequest) -> ScriptedOutput:
        if request.session_id in ("g1-0", "g1-1"):
            return out(demo_tokenizer, ANSWER, delay=0.2)  # all requests are out by then
        return slow(demo_tokenizer, CALL + "<|im_end|>", keep=4)

    engine = ScriptedEngine(script)
    with anyio.fail_after(20):  # the slow answers would take a minute without the aborts
        batch = await runner(engine, demo_tokenizer).run_batch(
            [PROMPT] * 3, target_groups=1, group_ids=["g0", "g1", "g2"]
        )
    assert [t.uid for t in batch.trajectories] == ["g1-0", "g1-1"]
    assert all(t.status is TrajectoryStatus.COMPLETED for t in batch.trajectories)
    assert sorted(t.uid for t in batch.leftover) == ["g0-0", "g0-1", "g2-0", "g2-1"]
    assert batch.partial == batch.leftover
    slow_rids = [str(r.rid) for r in engine.requests if r.session_id not in ("g1-0", "g1-1")]
    assert sorted(engine.aborted) == sorted(slow_rids)  # each in-flight request, by rid
    for t in batch.leftover:
        assert t.finish_reason == "abort" and t.resume_point is not None
        assert t.response_ids == ids(demo_tokenizer, CALL)[:4]  # the partial output is kept
        assert t.loss_mask == [1] * 4 and t.rollout_logprobs == [-0.25] * 4


async def test_groups_stay_whole_and_resume_completes_them(demo_tokenizer: Any) -> None:
    def first(request: GenerateRequest) -> ScriptedOutput:
        if request.session_id == "g0-1":
            return slow(demo_tokenizer, ANSWER, keep=2)
        if request.session_id in ("g1-0", "g1-1"):
            return out(demo_tokenizer, ANSWER, delay=0.3)  # later than g0-0, but whole
        return out(demo_tokenizer, ANSWER)

    engine = ScriptedEngine(first)
    rollout = runner(engine, demo_tokenizer)
    with anyio.fail_after(20):
        batch = await rollout.run_batch([PROMPT] * 2, target_groups=1, group_ids=["g0", "g1"])
    assert [t.uid for t in batch.trajectories] == ["g1-0", "g1-1"]
    leftover = by_uid(batch.leftover)
    assert leftover["g0-0"].status is TrajectoryStatus.COMPLETED  # finished, sibling was not
    assert leftover["g0-1"].status is TrajectoryStatus.ABORTED
    assert [t.uid for t in batch.partial] == ["g0-1"]

    rest = ids(demo_tokenizer, ANSWER)[2:]
    rollout.engine = ScriptedEngine([ScriptedOutput(rest, logprobs=[-0.5] * len(rest))])
    resumed = await rollout.resume(batch.leftover)
    assert resumed.leftover == ()
    done = by_uid(resumed.trajectories)
    assert done["g0-0"] is leftover["g0-0"]  # passed through unchanged
    assert done["g0-1"].status is TrajectoryStatus.COMPLETED
    assert done["g0-1"].response_ids == ids(demo_tokenizer, ANSWER)
    assert done["g0-1"].rollout_logprobs == [-0.25] * 2 + [-0.5] * len(rest)


async def test_per_sample_target_when_groups_need_not_stay_whole(demo_tokenizer: Any) -> None:
    def script(request: GenerateRequest) -> ScriptedOutput:
        if request.session_id in ("g0-0", "g1-1"):
            return out(demo_tokenizer, ANSWER)
        return slow(demo_tokenizer, ANSWER, keep=1)

    engine = ScriptedEngine(script)
    with anyio.fail_after(20):
        batch = await runner(engine, demo_tokenizer).run_batch(
            [PROMPT] * 2, target_groups=1, keep_groups_whole=False, group_ids=["g0", "g1"]
        )
    assert [t.uid for t in batch.trajectories] == ["g0-0", "g1-1"]  # 1 group's worth: 2
    assert sorted(t.uid for t in batch.partial) == ["g0-1", "g1-0"]


async def test_resumed_open_turn_is_token_exact(demo_tokenizer: Any) -> None:
    """A tool call cut mid-way resumes from prompt + partial ids, then runs the tool."""
    call = ids(demo_tokenizer, CALL + "<|im_end|>")
    cut = 9
    engine = ScriptedEngine(
        [
            ScriptedOutput(
                call[:cut],
                logprobs=[-0.1] * cut,
                finish_reason=FinishReason(type="abort", message="Aborted"),
                weight_version="v1",
            )
        ]
    )
    rollout = runner(engine, demo_tokenizer, n=1, sampling=SamplingParams(max_new_tokens=64))
    [partial] = await rollout.run([PROMPT])
    assert partial.status is TrajectoryStatus.ABORTED and partial.response_ids == call[:cut]
    assert partial.num_turns == 1 and partial.metrics["drift_mismatches"] == 0
    partial = pickle.loads(pickle.dumps(partial))  # a resume point travels (queues, Ray)

    rest = call[cut:]
    engine2 = ScriptedEngine(
        [
            ScriptedOutput(rest, logprobs=[-0.2] * len(rest), weight_version="v2"),
            out(demo_tokenizer, ANSWER, weight_version="v2"),
        ]
    )
    rollout.engine = engine2
    resumed = await rollout.resume([partial])
    [done] = resumed.trajectories
    first = engine2.requests[0]
    assert list(first.input_ids) == list(partial.prompt_ids) + call[:cut]
    assert first.sampling.max_new_tokens == 64 - cut  # the turn's cap counts both legs
    assert done.status is TrajectoryStatus.COMPLETED, done.error
    assert done.num_turns == 2 and done.num_tool_calls == 1  # the cut turn is one turn
    assert done.spans[0].kind == "model" and list(done.spans[0].ids) == call
    assert list(done.spans[0].logprobs) == [-0.1] * cut + [-0.2] * len(rest)
    assert done.prompt_ids == partial.prompt_ids
    assert done.response_ids[: len(call)] == call
    assert len(done.loss_mask) == len(done.response_ids) == len(done.rollout_logprobs)
    assert [m["role"] for m in done.messages][2:] == ["assistant", "tool", "assistant"]
    assert done.messages[2]["tool_calls"][0]["function"]["arguments"] == {"expression": "2 + 3"}
    assert done.messages[3]["content"] == "5"  # the real tool ran on the completed call
    second = engine2.requests[1]
    assert (
        list(second.input_ids)
        == list(done.prompt_ids) + done.response_ids[: len(second.input_ids) - len(done.prompt_ids)]
    )
    assert done.metrics["resumes"] == 1
    assert done.metrics["weight_versions"][:2] == [[0, cut, "v1"], [cut, len(call), "v2"]]
    assert done.weight_version == "v2"
    assert done.metrics["drift_mismatches"] == 0


async def test_stopped_between_turns_resumes_at_the_next_turn(
    demo_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped after its tool turn, before the next request: nothing is lost or repeated.

    With ``tools_at_target="finish"`` the tool call running at the target finishes first.
    """
    gate = anyio.Event()

    def script(request: GenerateRequest) -> ScriptedOutput:
        if request.session_id == "g1-0":
            return out(demo_tokenizer, ANSWER)
        return out(demo_tokenizer, CALL + "<|im_end|>")

    engine = ScriptedEngine(script)
    rollout = runner(engine, demo_tokenizer, n=1, tools_at_target="finish")
    real_run_calls = rollout.tools.run_calls

    async def slow_tools(*args: Any) -> Any:
        await gate.wait()
        return await real_run_calls(*args)

    monkeypatch.setattr(rollout.tools, "run_calls", slow_tools)

    def on_result(t: Trajectory) -> None:
        gate.set()  # g1 is in: let g0's tool finish, after the target is met

    with anyio.fail_after(20):
        batch = await rollout.run_batch(
            [PROMPT] * 2, target_groups=1, group_ids=["g0", "g1"], on_result=on_result
        )
    [partial] = batch.partial
    assert partial.uid == "g0-0" and partial.num_tool_calls == 1
    assert [s.kind for s in partial.spans] == ["model", "tool"]
    assert "straggler" in (partial.error or "")
    monkeypatch.setattr(rollout.tools, "run_calls", real_run_calls)
    engine2 = ScriptedEngine([out(demo_tokenizer, ANSWER)])
    rollout.engine = engine2
    [done] = (await rollout.resume(batch.partial)).trajectories
    request = engine2.requests[0]
    assert list(request.input_ids) == list(partial.prompt_ids) + partial.response_ids
    assert done.status is TrajectoryStatus.COMPLETED and done.num_turns == 2


async def test_bad_targets_are_one_line_user_errors(demo_tokenizer: Any) -> None:
    rollout = runner(ScriptedEngine([]), demo_tokenizer)
    with pytest.raises(UserError, match="target_groups"):
        await rollout.run_batch([PROMPT], target_groups=2)
    finished = Trajectory(
        uid="g-0",
        group_id="g",
        prompt_index=0,
        sample_index=0,
        prompt_ids=(),
        spans=(),
        messages=(),
        status=TrajectoryStatus.ABORTED,
        finish_reason="abort",
    )
    with pytest.raises(UserError, match="no resume point"):
        await rollout.resume([finished])


def char_ids(tokenizer: Any, text: str) -> list[int]:
    """The text's ids one character at a time: the same text, not the tokenizer's ids."""
    return [i for ch in text for i in ids(tokenizer, ch)] + ids(tokenizer, "<|im_end|>")


@pytest.mark.parametrize("every", [None, 1, 2])
async def test_drift_reports_equal_a_check_after_every_turn(
    demo_tokenizer: Any, every: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = 0
    real = check_drift

    def counting(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return real(*args, **kwargs)

    def script() -> list[ScriptedOutput]:
        odd = char_ids(demo_tokenizer, CALL)  # decodes to CALL, but not CALL's ids
        return [
            out(demo_tokenizer, CALL + "<|im_end|>"),
            ScriptedOutput(odd),
            out(demo_tokenizer, CALL + "<|im_end|>"),
            out(demo_tokenizer, ANSWER),
        ]

    config: dict[str, Any] = {"n": 1, "max_turns": 6}
    [reference] = await runner(
        ScriptedEngine(script()), demo_tokenizer, drift_check_every=1, **config
    ).run([PROMPT])
    monkeypatch.setattr("toolrollout.rollout._drift.check_drift", counting)
    [traj] = await runner(
        ScriptedEngine(script()), demo_tokenizer, drift_check_every=every, **config
    ).run([PROMPT])
    assert traj.status is TrajectoryStatus.COMPLETED
    assert reference.metrics["drift_mismatches"] == 2  # after tool turns 2 and 3
    assert traj.metrics["drift_reports"] == reference.metrics["drift_reports"]
    assert traj.metrics["drift_mismatches"] == 2
    assert calls == 3  # drift found: every checkpoint checked once, none twice


async def test_without_drift_the_default_renders_once_per_trajectory(
    demo_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = 0
    real = check_drift

    def counting(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return real(*args, **kwargs)

    monkeypatch.setattr("toolrollout.rollout._drift.check_drift", counting)
    engine = ScriptedEngine(
        [out(demo_tokenizer, CALL + "<|im_end|>")] * 5 + [out(demo_tokenizer, ANSWER)]
    )
    [traj] = await runner(engine, demo_tokenizer, n=1, max_turns=8).run([PROMPT])
    assert traj.status is TrajectoryStatus.COMPLETED and traj.num_tool_calls == 5
    assert traj.metrics["drift_mismatches"] == 0
    assert calls == 1  # one render at the end, not one per turn


async def test_a_lost_abort_is_sent_again(
    demo_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SGLang drops an abort that beats its request to the server: the runner repeats it."""
    monkeypatch.setattr("toolrollout.rollout._batch.ABORT_RESEND_SECONDS", 0.1)

    class DropsFirstAbort(ScriptedEngine):
        async def abort(self, rid: str) -> None:
            if rid in self.aborted:
                await super().abort(rid)
            else:
                self.aborted.append(rid)  # recorded, but the request runs on

    def script(request: GenerateRequest) -> ScriptedOutput:
        if request.session_id == "g0-0":
            return out(demo_tokenizer, ANSWER, delay=0.2)  # g1's request is out by then
        return slow(demo_tokenizer, ANSWER, keep=3)

    engine = DropsFirstAbort(script)
    with anyio.fail_after(20):
        batch = await runner(engine, demo_tokenizer, n=1).run_batch(
            [PROMPT] * 2, target_groups=1, group_ids=["g0", "g1"]
        )
    [partial] = batch.partial
    [rid] = [str(r.rid) for r in engine.requests if r.session_id == "g1-0"]
    assert engine.aborted.count(rid) >= 2
    assert partial.response_ids == ids(demo_tokenizer, ANSWER)[:3]


async def test_tool_calls_running_at_the_target_are_cancelled_and_run_again_on_resume(
    demo_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default: the batch does not wait for a tool call (here, one that never ends).

    The trajectory ends after its model turn, as if the calls had not started; resumed, it
    runs them and goes on, token for token.
    """
    never = anyio.Event()
    cancelled: list[str] = []

    def script(request: GenerateRequest) -> ScriptedOutput:
        if request.session_id == "g1-0":
            return out(demo_tokenizer, ANSWER, delay=0.2)  # g0 is in its tool call by then
        return out(demo_tokenizer, CALL + "<|im_end|>")

    engine = ScriptedEngine(script)
    rollout = runner(engine, demo_tokenizer, n=1)
    real_run_calls = rollout.tools.run_calls

    async def hanging_tools(*args: Any) -> Any:
        try:
            await never.wait()
        except anyio.get_cancelled_exc_class():
            cancelled.append("g0")
            raise
        return await real_run_calls(*args)

    monkeypatch.setattr(rollout.tools, "run_calls", hanging_tools)
    with anyio.fail_after(20):  # without the cancel the batch would wait for ever
        batch = await rollout.run_batch([PROMPT] * 2, target_groups=1, group_ids=["g0", "g1"])
    assert cancelled == ["g0"]
    [partial] = batch.partial
    assert partial.uid == "g0-0" and partial.status is TrajectoryStatus.ABORTED
    assert "during its tool calls" in (partial.error or "")
    assert [s.kind for s in partial.spans] == ["model"]  # nothing of the calls is kept
    assert partial.num_turns == 1 and partial.num_tool_calls == 0
    assert partial.metrics["tool_calls_cancelled"] == 1  # counted, not silent
    assert partial.messages[-1]["role"] == "assistant"
    monkeypatch.setattr(rollout.tools, "run_calls", real_run_calls)
    engine2 = ScriptedEngine([out(demo_tokenizer, ANSWER)])
    rollout.engine = engine2
    [done] = (await rollout.resume(batch.partial)).trajectories
    assert done.status is TrajectoryStatus.COMPLETED, done.error
    assert done.num_turns == 2 and done.num_tool_calls == 1
    assert [s.kind for s in done.spans] == ["model", "tool", "model"]
    assert done.messages[3]["role"] == "tool" and done.messages[3]["content"] == "5"
    assert done.messages[2]["tool_calls"][0]["id"] == done.messages[3]["tool_call_id"]
    # the first resumed request is the partial's ids plus the tool turn's delta, exactly
    request = engine2.requests[0]
    tool_delta = list(done.spans[1].ids)
    assert list(request.input_ids) == list(partial.prompt_ids) + partial.response_ids + tool_delta
    assert done.response_ids[: len(partial.response_ids)] == partial.response_ids
    assert done.metrics["drift_mismatches"] == 0 and done.metrics["resumes"] == 1
    assert done.metrics["tool_calls_cancelled"] == 1  # the trajectory's whole life
