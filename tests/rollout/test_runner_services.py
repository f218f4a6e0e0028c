"""``RolloutRunner`` opens its tools' services: once under ``async with runner:``, else per call."""

from __future__ import annotations

from collections.abc import AsyncIterator, Hashable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.lowlevel

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


@dataclass(frozen=True, kw_only=True)
class GatedProbe(Probe):
    """Its n-th call waits for ``gates[n]``, so a test decides which call ends first."""

    gates: tuple[anyio.Event, ...] = ()
    calls: list[int] = field(default_factory=list, compare=False)

    async def call(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        index = len(self.calls)
        self.calls.append(index)
        await self.gates[index].wait()
        return ToolResult(text="open" if self.service.is_open else "closed")


async def test_overlapping_calls_on_a_runner_not_entered_share_the_services(
    demo_tokenizer: Any,
) -> None:
    gates = (anyio.Event(), anyio.Event())
    probe = GatedProbe(gates=gates)
    steps = []
    for text in (CALL, CALL, "Done.<|im_end|>", "Done.<|im_end|>"):  # the calls interleave
        out = list(demo_tokenizer.encode(text, add_special_tokens=False))
        steps.append(ScriptedOutput(out, logprobs=[-0.5] * len(out)))
    runner = RolloutRunner(ScriptedEngine(steps), demo_tokenizer, [probe])
    first_finished = anyio.Event()
    returned: list[str] = []
    answers: dict[str, str] = {}

    async def call(name: str, on_result: Any = None) -> None:
        [trajectory] = await runner.run([PROMPT], on_result=on_result)
        answers[name] = tool_answer(trajectory)
        returned.append(name)

    async with anyio.create_task_group() as tg:
        tg.start_soon(call, "first", lambda _t: first_finished.set())
        await probe.service.entered.wait()
        tg.start_soon(call, "second")
        while len(probe.calls) < 2:  # both calls are inside their tool call
            await anyio.lowlevel.checkpoint()
        gates[0].set()
        await first_finished.wait()
        # The first call's trajectory is done, but the second still uses the services:
        # they stay open, and the first call returns only once the second is done.
        for _ in range(20):
            await anyio.lowlevel.checkpoint()
        assert returned == [] and probe.service.is_open
        gates[1].set()
    assert sorted(returned) == ["first", "second"]
    assert answers == {"first": "open", "second": "open"}
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


async def test_two_runners_on_one_tool_set_share_one_opening(demo_tokenizer: Any) -> None:
    # verl's agent loop builds a runner per sample on the worker's one tool set: the first
    # sample's call must not close the services under the second.
    gates = (anyio.Event(), anyio.Event(), anyio.Event())
    gates[2].set()  # the later call needs no gate
    probe = GatedProbe(gates=gates)

    def runner() -> RolloutRunner:
        steps = []
        for text in (CALL, "Done.<|im_end|>"):
            out = list(demo_tokenizer.encode(text, add_special_tokens=False))
            steps.append(ScriptedOutput(out, logprobs=[-0.5] * len(out)))
        return RolloutRunner(ScriptedEngine(steps), demo_tokenizer, [probe])

    answers: list[str] = []

    async def call(on_result: Any = None) -> None:
        [trajectory] = await runner().run([PROMPT], on_result=on_result)
        answers.append(tool_answer(trajectory))

    first_finished = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(call, lambda _t: first_finished.set())
        await probe.service.entered.wait()
        tg.start_soon(call)
        while len(probe.calls) < 2:
            await anyio.lowlevel.checkpoint()
        gates[0].set()
        await first_finished.wait()
        assert probe.service.is_open  # still needed by the second runner's call
        gates[1].set()
    assert answers == ["open", "open"]
    assert probe.service.log == ["open", "close"]
    [later] = await runner().run([PROMPT])  # a later call opens them anew
    assert tool_answer(later) == "open"
    assert probe.service.log == ["open", "close", "open", "close"]
