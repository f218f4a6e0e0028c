"""Built-in tools: the demo calculator end to end, and the GSM8K checker."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolrollout._exceptions import UserError
from toolrollout.tools import (
    Gsm8kTool,
    ToolCallRequest,
    ToolContext,
    ToolExecutor,
    ToolSession,
    calculator_tool,
    load_tool_config,
)
from toolrollout.tools._builtin import gsm8k_score
from toolrollout.tools.calculator import CALCULATOR_TOOL

CALCULATOR_YAML = Path(__file__).resolve().parents[2] / "tool_configs" / "calculator.yaml"


def test_calculator_schema_is_the_demo_schema() -> None:
    assert calculator_tool().schema() == CALCULATOR_TOOL


async def test_calculator_end_to_end_through_yaml_and_executor() -> None:
    tools = load_tool_config(CALCULATOR_YAML)
    executor = ToolExecutor(tools)
    results = await executor.run_calls(
        [
            ToolCallRequest("calculator", {"expression": "3 * (4 + 5)"}, id="c1"),
            ToolCallRequest("calculator", '{"expression": "84 / 7"}', id="c2"),
            ToolCallRequest("calculator", {"expression": "__import__('os')"}, id="c3"),
            ToolCallRequest("calculator", {"expression": 42}, id="c4"),
        ]
    )
    assert [r.text for r in results[:2]] == ["27", "12"]
    assert not results[0].is_error
    assert results[2].is_error and results[2].text.startswith("Error:")
    assert results[2].error is None  # a model mistake the tool answered, not a crash
    assert results[3].is_error and "'expression'" in results[3].text
    stats = executor.statistics().tools["calculator"]
    assert (stats.calls, stats.errors, stats.invalid_arguments) == (4, 2, 1)


def test_gsm8k_score() -> None:
    assert gsm8k_score("#### 72", "72") == 1.0
    assert gsm8k_score("so the answer is 1,234.", "1234") == 1.0
    assert gsm8k_score("72.0", "#### 72") == 1.0
    assert gsm8k_score("#### 71", "72") == 0.0
    assert gsm8k_score("no number", "72") == 0.0


async def test_gsm8k_reads_verl_tools_kwargs_and_tracks_best_reward() -> None:
    tool = Gsm8kTool()
    metadata = {"tools_kwargs": {tool.name: {"create_kwargs": {"ground_truth": "18"}}}}
    session = ToolSession("traj-1", metadata)
    context = ToolContext(metadata=metadata, session=session)
    first = await tool.call({"answer": "18"}, context)
    again = await tool.call({"answer": "18"}, context)
    assert first.text == "Current parsed answer='18' reward=1.0"
    assert (first.reward, again.reward) == (0.0, -0.05)  # no improvement: penalty, like verl
    assert first.metrics == {"answer_reward": 1.0}
    assert await session.calc_rewards() == {tool.name: 1.0}
    await session.release_all()
    assert session._instances == {} and tool._instances == {}
    with pytest.raises(UserError, match="ground truth"):
        await tool.call({"answer": "1"}, ToolContext())
