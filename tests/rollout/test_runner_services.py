"""``RolloutRunner`` opens its tools' services: once under ``async with runner:``, else per call."""

from __future__ import annotations

from collections.abc import AsyncIterator, Hashable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest

from toolrollout._exceptions import UserError
from toolrollout.rollout import RolloutRunner, TrajectoryStatus
from toolrollout.testing import ScriptedEngine, ScriptedOutput
from toolrollout.tools import Tool, ToolContext, ToolResult, ToolService

PROMPT = [{"role": "user", "content": "Is the service open?"}]
CALL = '<tool_call>\n{"name": "probe", "arguments": {}}\n</tool_call><|im_end|>'


@dataclass(frozen=True, slots=True)
class Recorder:
    log: list[str] = field(default_factory=list, compare=False)
    entered: anyio.Event = field(default_factory=anyio.Event, compare=False)
    release: anyio.Event | None = field(default=None, compare=False)

    @property
    def key(self) -> Hashable:
        return "recorder"

    @property
    def is_open(self) -> bool:
        return self.log.count("open") > self.log.count("close")

    @asynccontextmanager
    async def open(self) -> AsyncIterator[None]:
        self.log.append("open")
        self.entered.set()
        try:
            yield
        finally:
            self.log.append("close")


@dataclass(frozen=True, kw_only=True)
class Probe(Tool):
    name: str = "probe"
    service: Recorder = field(default_factory=Recorder, compare=False)

    def services(self) -> Sequence[ToolService]:
        return (self.service,)

    async def call(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        if self.service.release is not None:
            await self.service.release.wait()
        return ToolResult(text="open" if self.service.is_open else "closed")


def engine(tokenizer: Any, runs: int) -> ScriptedEngine:
    steps: list[Any] = []
    for _ in range(runs):
        for text in (CALL, "Done.<|im_end|>"):
            out = list(tokenizer.encode(text, add_special_tokens=False))
            steps.append(ScriptedOutput(out, logprobs=[-0.5] * len(out)))
    return ScriptedEngine(steps)


def tool_answer(trajectory: Any) -> str:
    assert trajectory.status is TrajectoryStatus.COMPLETED, trajectory.error
    [message] = [m for m in trajectory.messages if m["role"] == "tool"]
    return str(message["content"])


async def test_async_with_runner_opens_the_services_once(demo_tokenizer: Any) -> None:
    probe = Probe()
    runner = RolloutRunner(engine(demo_tokenizer, 2), demo_tokenizer, [probe])
    async with runner as entered:
        assert entered is runner
        assert probe.service.log == ["open"]
        [first] = await runner.run([PROMPT])
        batch = await runner.run_batch([PROMPT], target_groups=1)
        assert probe.service.log == ["open"]
    assert probe.service.log == ["open", "close"]
    assert tool_answer(first) == "open"
    assert [tool_answer(t) for t in batch.trajectories] == ["open"]


async def test_a_call_on_a_runner_not_entered_opens_them_for_its_length(
    demo_tokenizer: Any,
) -> None:
    probe = Probe()
    runner = RolloutRunner(engine(demo_tokenizer, 2), demo_tokenizer, [probe])
    [first] = await runner.run([PROMPT])
    assert probe.service.log == ["open", "close"]
    [second] = await runner.run([PROMPT])
    assert probe.service.log == ["open", "close"] * 2
    assert tool_answer(first) == tool_answer(second) == "open"


async def test_overlapping_calls_on_a_runner_not_entered_are_told_to_enter_it(
    demo_tokenizer: Any,
) -> None:
    probe = Probe(service=Recorder(release=anyio.Event()))
    runner = RolloutRunner(engine(demo_tokenizer, 1), demo_tokenizer, [probe])
    results: list[Any] = []

    async def first() -> None:
        results.extend(await runner.run([PROMPT]))

    async with anyio.create_task_group() as tg:
        tg.start_soon(first)
        await probe.service.entered.wait()
        with pytest.raises(UserError, match="async with runner:"):
            await runner.run([PROMPT])
        assert probe.service.release is not None
        probe.service.release.set()
    assert [tool_answer(t) for t in results] == ["open"]
    assert probe.service.log == ["open", "close"]


async def test_tools_without_services_cost_nothing(demo_tokenizer: Any) -> None:
    from toolrollout.tools import calculator_tool

    out = list(demo_tokenizer.encode("4<|im_end|>", add_special_tokens=False))
    steps = [ScriptedOutput(out, logprobs=[-0.5] * len(out)) for _ in range(2)]
    runner = RolloutRunner(ScriptedEngine(steps), demo_tokenizer, [calculator_tool()])
    done: list[Any] = []

    async def one() -> None:
        done.extend(await runner.run([PROMPT]))

    async with anyio.create_task_group() as tg:  # overlapping calls are fine here
        tg.start_soon(one)
        tg.start_soon(one)
    assert [t.status for t in done] == [TrajectoryStatus.COMPLETED] * 2
