"""ScriptedEngine, the test seam for rollout code."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from toolrollout._exceptions import UserError
from toolrollout.engines._base import Engine
from toolrollout.engines._types import FinishReason, GenerateRequest, SamplingParams
from toolrollout.testing import ScriptedEngine, ScriptedOutput


async def test_replays_a_list_and_records_requests() -> None:
    engine = ScriptedEngine(
        [
            ScriptedOutput([151657, 198, 151658, 151645], logprobs=[-0.1, -0.2, -0.3, -0.4]),
            [9707, 151645],
        ]
    )
    assert isinstance(engine, Engine)
    first = await engine.generate(GenerateRequest(input_ids=(1, 2, 3), rid="t0"))
    second = await engine.generate(GenerateRequest(input_ids=(1, 2, 3, 4), session_id="s"))
    assert first.rid == "t0"
    assert first.output_ids == (151657, 198, 151658, 151645)
    assert first.output_logprobs == (-0.1, -0.2, -0.3, -0.4)
    assert first.finish_reason == FinishReason(type="stop", matched=151645)
    assert (first.prompt_tokens, first.completion_tokens) == (3, 4)
    assert second.output_ids == (9707, 151645)
    assert second.output_logprobs == (0.0, 0.0)  # default logprob when none scripted
    assert [list(r.input_ids) for r in engine.requests] == [[1, 2, 3], [1, 2, 3, 4]]
    assert engine.requests[1].session_id == "s"
    with pytest.raises(UserError, match="ran out of scripted outputs"):
        await engine.generate(GenerateRequest(input_ids=(1,)))


async def test_callable_script_sees_the_request_and_may_be_async() -> None:
    async def script(request: GenerateRequest) -> list[int]:
        await anyio.lowlevel.checkpoint()
        return [len(request.input_ids), 7]

    engine = ScriptedEngine(script)
    result = await engine.generate(GenerateRequest(input_ids=(5, 5, 5), return_logprob=False))
    assert result.output_ids == (3, 7)
    assert result.output_logprobs is None

    sync_engine = ScriptedEngine(lambda request: ScriptedOutput([1], text="x"))
    assert (await sync_engine.generate(GenerateRequest(input_ids=(0,)))).text == "x"


async def test_max_new_tokens_truncates_with_length_finish() -> None:
    engine = ScriptedEngine([[1, 2, 3, 4, 5]])
    result = await engine.generate(
        GenerateRequest(input_ids=(0,), sampling=SamplingParams(max_new_tokens=3))
    )
    assert result.output_ids == (1, 2, 3)
    assert result.finish_reason == FinishReason(type="length", length=3)


async def test_abort_returns_partial_output_like_sglang() -> None:
    engine = ScriptedEngine([ScriptedOutput([1, 2, 3, 4], delay=10.0, abort_after=2)])
    results = []

    async def run() -> None:
        results.append(await engine.generate(GenerateRequest(input_ids=(0,), rid="r")))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(run)
            await anyio.sleep(0.01)
            await engine.abort("r")
    (result,) = results
    assert result.finish_reason.type == "abort"
    assert result.output_ids == (1, 2)
    assert engine.aborted == ["r"]


async def test_delay_without_abort_returns_full_output() -> None:
    engine = ScriptedEngine([ScriptedOutput([1, 2], delay=0.01)])
    async with engine:
        result = await engine.generate(GenerateRequest(input_ids=(0,)))
    assert result.output_ids == (1, 2) and result.finish_reason.type == "stop"
    assert engine.closed


def test_mismatched_logprobs_are_rejected() -> None:
    with pytest.raises(UserError):
        ScriptedOutput([1, 2], logprobs=[-0.1])
