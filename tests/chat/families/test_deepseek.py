"""DeepSeek-V3 (``deepseekv3``) and V3.1 (``deepseekv31``) with official templates, run for real.

Both templates end a turn with ``<｜end▁of▁sentence｜>`` and write nothing after it; tool
results follow directly and no generation prompt comes after them, so the model's next
turn starts right after ``<｜tool▁output▁end｜>`` (V3.1) or ``<｜tool▁outputs▁end｜>`` (V3).
Neither template reads ``tools``: the schemas go into the system prompt. Arguments are JSON
strings, which both templates print as they are.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from tests.chat.families.conftest import (
    build_tokenizer,
    fresh_render_ids,
    official_template,
    run_family,
)

from toolrollout.chat import ChatFormat
from toolrollout.chat.families import get_template_family
from toolrollout.rollout import RolloutConfig, TrajectoryStatus
from toolrollout.tools import Tool, function_tool

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
ADDED = [
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁outputs▁begin｜>",
    "<｜tool▁outputs▁end｜>",
    "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>",
    "<｜tool▁sep｜>",
    "<think>",
    "</think>",
]
B, E = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CB, CE, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def get_weather(city: str) -> str:
    """Current weather in a city."""
    return f"{city}: sunny\n21 C\nwind 3 km/h"


TOOLS: list[Tool] = [function_tool(add), function_tool(get_weather)]
PROMPT: list[dict[str, Any]] = [
    {"role": "system", "content": "You are careful."},
    {"role": "user", "content": "What is 2 + 3, and the weather in Paris?"},
]
WEATHER = "Paris: sunny\n21 C\nwind 3 km/h"


def tokenizer_for(template: str) -> Any:
    return build_tokenizer(
        special=[BOS, EOS], added=ADDED, template=official_template(template), eos=EOS, bos=BOS
    )


def v3_call(name: str, arguments: dict[str, Any]) -> str:
    return f"{CB}function{SEP}{name}\n```json\n{json.dumps(arguments)}\n```{CE}"


def v31_call(name: str, arguments: dict[str, Any]) -> str:
    return f"{CB}{name}{SEP}{json.dumps(arguments)}{CE}"


def check_run(runner: Any, trajectory: Any, calls: int) -> list[dict[str, Any]]:
    assert trajectory.status is TrajectoryStatus.COMPLETED, trajectory.error
    assert trajectory.num_tool_calls == calls and trajectory.parse_errors == 0
    assert trajectory.tool_errors == 0
    assert trajectory.metrics["drift_mismatches"] == 0
    messages = list(trajectory.messages)
    tools = [m["content"] for m in messages if m["role"] == "tool"]
    assert tools[:2] == ["5", WEATHER]
    prompt_text = runner.chat.decode(trajectory.prompt_ids)
    assert "You are careful.\n\n## Tools" in prompt_text and "### get_weather" in prompt_text
    return messages


# -- DeepSeek-V3 --------------------------------------------------------------------------

V3 = "trl-deepseekv3.jinja"
V3_TURNS = [
    "Both tools at once.</think>\n\n"
    f"{B}{v3_call('add', {'a': 2, 'b': 3})}\n{v3_call('get_weather', {'city': 'Paris'})}{E}{EOS}",
    f"{B}{v3_call('add', {'a': 5, 'b': 0})}{E}{EOS}",
    f"2 + 3 = 5, and Paris is sunny.{EOS}",
]


@pytest.fixture(scope="module")
def v3_tokenizer() -> Any:
    return tokenizer_for(V3)


def test_v3_detected_without_family(v3_tokenizer: Any) -> None:
    assert ChatFormat(v3_tokenizer).family.name == "deepseekv3"


def test_v3_runner_round_trip(v3_tokenizer: Any) -> None:
    runner, trajectory, _ = run_family(v3_tokenizer, TOOLS, V3_TURNS, PROMPT)
    assert runner.chat.family.name == "deepseekv3" and runner.parser.name == "deepseekv3"
    messages = check_run(runner, trajectory, 3)
    first = messages[2]
    assert first["reasoning_content"] == "Both tools at once." and first["content"] == ""
    assert first["tool_calls"][0]["function"]["arguments"] == '{"a": 2, "b": 3}'
    # The template drops think blocks and mis-renders a second call turn (never resetting
    # its first-call flag); both are the family's documented rewrite, nothing else differs.
    ids = [*trajectory.prompt_ids, *trajectory.response_ids]
    fresh = fresh_render_ids(v3_tokenizer, runner, trajectory)
    normal = runner.chat.family.history_normalizer
    assert normal is not None and fresh != ids
    assert normal(runner.chat.decode(ids)) == normal(runner.chat.decode(fresh))
    # Before the second call turn nothing but the think block differs.
    after_first = runner.chat.render_prompt(messages[:5])
    prefix = ids[
        : len(trajectory.prompt_ids) + len(trajectory.spans[0].ids) + len(trajectory.spans[1].ids)
    ]
    assert normal(runner.chat.decode(prefix)) == normal(runner.chat.decode(after_first))


# -- DeepSeek-V3.1 ------------------------------------------------------------------------

V31 = "deepseek-ai-DeepSeek-V3.1.jinja"
V31_TURNS = [
    f"Let me check.{B}{v31_call('add', {'a': 2, 'b': 3})}"
    f"{v31_call('get_weather', {'city': 'Paris'})}{E}{EOS}",
    f"{B}{v31_call('add', {'a': 5, 'b': 0})}{E}{EOS}",
    f"2 + 3 = 5, and Paris is sunny.{EOS}",
]


@pytest.fixture(scope="module")
def v31_tokenizer() -> Any:
    return tokenizer_for(V31)


def test_v31_detected_without_family(v31_tokenizer: Any) -> None:
    assert ChatFormat(v31_tokenizer).family.name == "deepseekv31"


def test_v31_runner_round_trip_token_exact(v31_tokenizer: Any) -> None:
    runner, trajectory, _ = run_family(v31_tokenizer, TOOLS, V31_TURNS, PROMPT)
    assert runner.chat.family.name == "deepseekv31" and runner.parser.name == "deepseekv31"
    messages = check_run(runner, trajectory, 3)
    assert trajectory.metrics["drift_expected"] == 0
    assert messages[2]["content"] == "Let me check." and len(messages[2]["tool_calls"]) == 2
    ids = [*trajectory.prompt_ids, *trajectory.response_ids]
    assert fresh_render_ids(v31_tokenizer, runner, trajectory) == ids


def test_v31_thinking_is_a_documented_rewrite(v31_tokenizer: Any) -> None:
    turns = [
        f"Two tools.</think>Let me check.{B}{v31_call('add', {'a': 2, 'b': 3})}"
        f"{v31_call('get_weather', {'city': 'Paris'})}{E}{EOS}",
        f"2 + 3 = 5, and Paris is sunny.{EOS}",
    ]
    config = RolloutConfig(chat_template_kwargs={"thinking": True})
    runner, trajectory, _ = run_family(v31_tokenizer, TOOLS, turns, PROMPT, config=config)
    assert runner.chat.decode(trajectory.prompt_ids).endswith("<｜Assistant｜><think>")
    messages = check_run(runner, trajectory, 2)
    assert messages[2]["reasoning_content"] == "Two tools."
    assert trajectory.metrics["drift_expected"] > 0  # <think>… re-renders as </think>
    ids = [*trajectory.prompt_ids, *trajectory.response_ids]
    fresh = fresh_render_ids(v31_tokenizer, runner, trajectory)
    normal = runner.chat.family.history_normalizer
    assert normal is not None and fresh != ids
    assert normal(runner.chat.decode(ids)) == normal(runner.chat.decode(fresh))


# -- both ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "bad"),
    [
        (V3, f'{B}{CB}function{SEP}add\n{{"a": 2}}{CE}{E}{EOS}'),
        (V31, f'{B}{CB}add{SEP}{{"a": }}{CE}{E}{EOS}'),
    ],
)
def test_malformed_call_is_a_counted_error(template: str, bad: str) -> None:
    tokenizer = tokenizer_for(template)
    _, trajectory, _ = run_family(tokenizer, TOOLS, [bad, f"Sorry.{EOS}"], PROMPT)
    assert trajectory.parse_errors == 1 and trajectory.num_tool_calls == 0
    assert trajectory.messages[3]["role"] == "tool"


def test_breaking_the_rules_fails(v31_tokenizer: Any) -> None:
    family = dataclasses.replace(get_template_family("deepseekv31"), boundary="\n")
    _, trajectory, _ = run_family(
        v31_tokenizer, TOOLS, V31_TURNS, PROMPT, config=RolloutConfig(family=family)
    )
    assert trajectory.status is TrajectoryStatus.FAILED
    # The V3 parser wants a fenced ```json block: every V3.1 call is an error.
    _, trajectory, _ = run_family(
        v31_tokenizer, TOOLS, V31_TURNS, PROMPT, config=RolloutConfig(tool_parser="deepseekv3")
    )
    assert trajectory.num_tool_calls == 0 and trajectory.parse_errors > 0
