"""The rollout loop against a scripted engine: token bookkeeping, statuses, faults.

The engine is the documented test seam (``toolrollout.testing.ScriptedEngine``); the tools,
the tokenizer and the chat template are the real ones. End-to-end runs with the real model
over HTTP live in ``test_rollout_e2e.py``.
"""

from __future__ import annotations

import json
import time
from typing import Any

import anyio
import pytest

from toolrollout.engines import FinishReason, GenerateRequest, SamplingParams
from toolrollout.rewards import numeric_match, tool_error_penalty
from toolrollout.rollout import RolloutConfig, RolloutRunner, Trajectory, TrajectoryStatus
from toolrollout.testing import ScriptedEngine, ScriptedOutput
from toolrollout.tools import ToolLimits, calculator_tool, function_tool
from toolrollout.tools.calculator import CALCULATOR_TOOL

CALL = '<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call><|im_end|>'
PROMPT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is 2 + 3?"},
]


def ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def call_text(name: str, **args: Any) -> str:
    return CALL.format(name=name, args=json.dumps(args))


def scripted(tokenizer: Any, *texts: str | ScriptedOutput) -> ScriptedEngine:
    steps: list[Any] = []
    for t in texts:
        if isinstance(t, str):
            out = ids(tokenizer, t)
            steps.append(ScriptedOutput(out, logprobs=[-0.5] * len(out)))
        else:
            steps.append(t)
    return ScriptedEngine(steps)


def check_token_invariants(traj: Trajectory, tokenizer: Any) -> None:
    n = len(traj.response_ids)
    assert len(traj.loss_mask) == n == len(traj.rollout_logprobs)
    for mask, logprob in zip(traj.loss_mask, traj.rollout_logprobs, strict=True):
        if mask == 0:
            assert logprob == 0.0


async def test_two_turn_calculator_trajectory(demo_tokenizer: Any) -> None:
    engine = scripted(
        demo_tokenizer,
        call_text("calculator", expression="2 + 3"),
        "The answer is 5.<|im_end|>",
    )
    runner = RolloutRunner(engine, demo_tokenizer, [calculator_tool()], rewards=[numeric_match])
    [traj] = await runner.run([{"messages": PROMPT, "answer": "5"}])
    assert traj.status is TrajectoryStatus.COMPLETED, traj.error
    assert traj.num_turns == 2 and traj.num_tool_calls == 1
    assert traj.reward == 1.0
    check_token_invariants(traj, demo_tokenizer)
    # The tool's REAL output went back into the context.
    tool_msgs = [m for m in traj.messages if m["role"] == "tool"]
    assert tool_msgs[0]["content"] == "5"
    # Model tokens are the engine's ids verbatim, mask 1, with the engine's logprobs.
    first = ids(demo_tokenizer, call_text("calculator", expression="2 + 3"))
    assert traj.response_ids[: len(first)] == first
    assert traj.loss_mask[: len(first)] == [1] * len(first)
    assert traj.rollout_logprobs[: len(first)] == [-0.5] * len(first)
    # Tool span: starts with the boundary newline, ends with the generation prompt, mask 0.
    tool_span = traj.spans[1]
    assert tool_span.kind == "tool"
    text = demo_tokenizer.decode(list(tool_span.ids))
    assert text.startswith("\n<|im_start|>user\n<tool_response>\n5\n</tool_response>")
    assert text.endswith("<|im_start|>assistant\n")
    # The second request's input is exactly prompt + everything so far (never re-tokenized).
    second_input = engine.requests[1].input_ids
    assert list(second_input) == list(traj.prompt_ids) + first + list(tool_span.ids)
    # Full transcript decodes to the template rendering of the final messages.
    assert traj.metrics["drift_mismatches"] == 0
    assert traj.metrics["tool_stats"]["calculator"]["calls"] == 1
    assert traj.metrics["tool_stats"]["calculator"]["errors"] == 0


async def test_length_truncated_turn_ends_the_trajectory(demo_tokenizer: Any) -> None:
    long = ids(demo_tokenizer, call_text("calculator", expression="2 + 3"))
    engine = ScriptedEngine([ScriptedOutput(long), "never used"])  # type: ignore[list-item]
    config = RolloutConfig(sampling=SamplingParams(max_new_tokens=5))
    runner = RolloutRunner(engine, demo_tokenizer, [calculator_tool()], config=config)
    [traj] = await runner.run([PROMPT])
    assert traj.status is TrajectoryStatus.TRUNCATED
    assert traj.finish_reason == "length"
    assert len(engine.requests) == 1  # no ghost turn after the cut
    assert traj.num_tool_calls == 0
    assert traj.loss_mask == [1] * 5


async def test_malformed_call_and_unknown_tool_are_reported_to_the_model(
    demo_tokenizer: Any,
) -> None:
    engine = scripted(
        demo_tokenizer,
        '<tool_call>\n{"name": "calculator", "arguments": {oops}\n</tool_call><|im_end|>',
        call_text("no_such_tool", x=1),
        "The answer is 5.<|im_end|>",
    )
    runner = RolloutRunner(
        engine,
        demo_tokenizer,
        [calculator_tool()],
        rewards=[numeric_match, tool_error_penalty(0.25)],
    )
    [traj] = await runner.run([{"messages": PROMPT, "answer": "5"}])
    assert traj.status is TrajectoryStatus.COMPLETED
    assert traj.parse_errors == 1
    assert traj.tool_errors == 1
    tool_texts = [m["content"] for m in traj.messages if m["role"] == "tool"]
    assert "could not parse" in tool_texts[0]
    assert "no_such_tool" in tool_texts[1]
    assert traj.reward == pytest.approx(1.0 - 0.5)
    check_token_invariants(traj, demo_tokenizer)
    # The malformed turn keeps the model's own text, so the messages still render to the tokens.
    assert traj.messages[2]["content"].startswith('<tool_call>\n{"name": "calculator"')
    assert "tool_calls" not in traj.messages[2]
    assert traj.metrics["drift_mismatches"] == 0
    rendered = demo_tokenizer.apply_chat_template(
        list(traj.messages), tools=[CALCULATOR_TOOL], tokenize=False
    )
    decoded = demo_tokenizer.decode(list(traj.prompt_ids) + traj.response_ids)
    assert rendered == decoded + "\n"


async def test_raising_and_hanging_tools_become_errors(demo_tokenizer: Any) -> None:
    cancelled = []

    @function_tool
    def broken(x: int) -> str:
        """Always fails.

        Args:
            x: ignored.
        """
        raise RuntimeError("disk on fire")

    @function_tool(limits=ToolLimits(timeout=0.2))
    async def slow(x: int) -> str:
        """Never answers in time.

        Args:
            x: ignored.
        """
        try:
            await anyio.sleep(30)
        finally:
            cancelled.append(True)
        return "late"

    engine = scripted(
        demo_tokenizer,
        call_text("broken", x=1)[: -len("<|im_end|>")] + "\n" + call_text("slow", x=2),
        "Done.<|im_end|>",
    )
    runner = RolloutRunner(engine, demo_tokenizer, [broken, slow])
    started = time.perf_counter()
    [traj] = await runner.run([PROMPT])
    assert time.perf_counter() - started < 5
    assert cancelled == [True]
    assert traj.status is TrajectoryStatus.COMPLETED
    assert traj.tool_errors == 2
    texts = [m["content"] for m in traj.messages if m["role"] == "tool"]
    assert "disk on fire" in texts[0]
    assert "timed out" in texts[1]
    stats = traj.metrics["tool_stats"]
    assert stats["slow"]["timeouts"] == 1
    assert stats["broken"]["error_kinds"] == {"ToolExecutionError": 1}


async def test_reward_exception_marks_failed_not_zero(demo_tokenizer: Any) -> None:
    def broken_reward(trajectory: Trajectory) -> float:
        raise KeyError("missing field")

    engine = scripted(demo_tokenizer, "5<|im_end|>")
    runner = RolloutRunner(engine, demo_tokenizer, [calculator_tool()], rewards=[broken_reward])
    [traj] = await runner.run([PROMPT])
    assert traj.status is TrajectoryStatus.FAILED
    assert traj.reward is None
    assert "missing field" in (traj.error or "")
    assert traj.to_row()["failed"] is True


async def test_max_turns_and_response_budget(demo_tokenizer: Any) -> None:
    call = call_text("calculator", expression="1 + 1")
    engine = scripted(demo_tokenizer, *([call] * 10))
    config = RolloutConfig(max_turns=3)
    runner = RolloutRunner(engine, demo_tokenizer, [calculator_tool()], config=config)
    [traj] = await runner.run([PROMPT])
    assert traj.status is TrajectoryStatus.TRUNCATED and traj.finish_reason == "max_turns"
    assert traj.num_turns == 3 and len(engine.requests) == 3

    engine = scripted(demo_tokenizer, *([call] * 10))
    budget = len(ids(demo_tokenizer, call)) + 3
    config = RolloutConfig(max_response_tokens=budget)
    runner = RolloutRunner(engine, demo_tokenizer, [calculator_tool()], config=config)
    [traj] = await runner.run([PROMPT])
    assert traj.status is TrajectoryStatus.TRUNCATED
    assert len(traj.response_ids) <= budget


async def test_groups_order_and_no_lockstep(demo_tokenizer: Any) -> None:
    """A slow trajectory does not hold up the others; results come back in order."""
    finished: list[int] = []
    quick = ids(demo_tokenizer, "4<|im_end|>")

    async def respond(request: GenerateRequest) -> ScriptedOutput:
        # prompt 0's samples are slow; prompt 1's are quick
        text = demo_tokenizer.decode(list(request.input_ids))
        if "slow" in text:
            await anyio.sleep(0.5)
        return ScriptedOutput(quick)

    engine = ScriptedEngine(respond)
    runner = RolloutRunner(
        engine, demo_tokenizer, [calculator_tool()], config=RolloutConfig(n=3, seed=7)
    )
    prompts = [
        [{"role": "user", "content": "slow question"}],
        [{"role": "user", "content": "fast question"}],
    ]
    results = await runner.run(prompts, on_result=lambda t: finished.append(t.prompt_index))
    assert [(t.prompt_index, t.sample_index) for t in results] == [
        (p, s) for p in range(2) for s in range(3)
    ]
    assert len({t.group_id for t in results[:3]}) == 1
    assert results[0].group_id != results[3].group_id
    assert finished[:3] == [1, 1, 1]  # the quick group finished first
    seeds = {r.sampling.seed for r in engine.requests}
    assert len(seeds) == 6  # distinct, reproducible seed per sample


async def test_engine_abort_marks_aborted(demo_tokenizer: Any) -> None:
    out = ids(demo_tokenizer, "The answer")
    engine = ScriptedEngine(
        [ScriptedOutput(out, finish_reason=FinishReason(type="abort", message="Aborted"))]
    )
    runner = RolloutRunner(engine, demo_tokenizer, [calculator_tool()], rewards=[numeric_match])
    [traj] = await runner.run([{"messages": PROMPT, "answer": "5"}])
    assert traj.status is TrajectoryStatus.ABORTED
    assert traj.reward is None
