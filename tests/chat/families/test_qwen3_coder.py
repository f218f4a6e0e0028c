"""Qwen3-Coder end to end with its official template: XML calls parsed, typed and run.

Rule under test: ``qwen3_coder`` transcripts are token-exact. Its calls are
``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nvalue\\n</parameter>…``; the parser types
each value by the tool's schema (integers, arrays), multi-line values keep their lines,
and the official template renders the typed arguments back to the model's exact text.
Before this family existed the template was taken for ``qwen25`` and every call was a
malformed-call error; the last test pins that this is what the old parser does with it.
"""

from __future__ import annotations

import pytest
from tests.chat.families.conftest import fresh_render_ids, run_family
from tests.chat.families.qwen_common import TOOLS, fresh_official_ids, qwen_tokenizer, transcript
from transformers import PreTrainedTokenizerBase

from toolrollout.chat import ChatFormat
from toolrollout.rollout import RolloutConfig, TrajectoryStatus
from toolrollout.tools import Tool, function_tool


def write_note(title: str, body: str, tags: list[str]) -> str:
    """Save a note with a title, a body and tags."""
    return f"saved {title!r}: {len(body.splitlines())} lines, tags {', '.join(tags)}"


CODER_TOOLS: list[Tool] = [*TOOLS, function_tool(write_note)]
PROMPT = [
    {"role": "system", "content": "You are a careful assistant."},
    {"role": "user", "content": "Add 2 and 3, check Paris, then write me a note."},
]


def xml_call(name: str, **params: str) -> str:
    """A call as the Qwen3-Coder template writes it."""
    body = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


NOTE_BODY = "Paris is sunny.\nTake a hat."
TURNS = [
    "I will add and check the weather.\n\n"
    + xml_call("add", a="2", b="3")
    + "\n"
    + xml_call("get_weather", city="Paris")
    + "<|im_end|>",
    xml_call("write_note", title="Trip", body=NOTE_BODY, tags='["travel", "weather"]')
    + "<|im_end|>",
    "Done: 5, sunny, and the note is saved.<|im_end|>",
]


@pytest.fixture(scope="module", params=["Qwen3-Coder.jinja", "Qwen3-Coder-llamacpp-2026.jinja"])
def tokenizer(request: pytest.FixtureRequest) -> PreTrainedTokenizerBase:
    return qwen_tokenizer(request.param, qwen3=True)


def test_detected_from_the_official_template(tokenizer: PreTrainedTokenizerBase) -> None:
    chat = ChatFormat(tokenizer)
    assert chat.family.name == "qwen3_coder" and chat.family.tool_parser == "qwen3_coder"


def test_xml_calls_run_typed_and_token_exact(tokenizer: PreTrainedTokenizerBase) -> None:
    runner, trajectory, _ = run_family(tokenizer, CODER_TOOLS, TURNS, PROMPT)
    assert runner.parser.name == "qwen3_coder"
    assert trajectory.status is TrajectoryStatus.COMPLETED, trajectory.error
    assert trajectory.num_tool_calls == 3 and trajectory.parse_errors == 0
    assert trajectory.tool_errors == 0
    assert trajectory.metrics["drift_mismatches"] == 0
    calls = [
        call["function"]
        for message in trajectory.messages
        if message["role"] == "assistant"
        for call in message.get("tool_calls", ())
    ]
    assert calls == [
        {"name": "add", "arguments": {"a": 2, "b": 3}},
        {"name": "get_weather", "arguments": {"city": "Paris"}},
        {
            "name": "write_note",
            "arguments": {"title": "Trip", "body": NOTE_BODY, "tags": ["travel", "weather"]},
        },
    ]
    assert [m["content"] for m in trajectory.messages if m["role"] == "tool"] == [
        "5",
        "Paris: sunny, 21 C\nwind: 5 km/h from the west\nhumidity: 40%",
        "saved 'Trip': 2 lines, tags travel, weather",
    ]
    assert transcript(trajectory) == fresh_official_ids(tokenizer, trajectory, runner.chat.tools)
    assert transcript(trajectory) == fresh_render_ids(tokenizer, runner, trajectory)


def test_malformed_call_is_a_counted_parse_error(tokenizer: PreTrainedTokenizerBase) -> None:
    bad = "<tool_call>\n<function=add>\n<parameter=a>\n2\n</function>\n</tool_call><|im_end|>"
    _, trajectory, _ = run_family(tokenizer, CODER_TOOLS, [bad, "Sorry.<|im_end|>"], PROMPT)
    assert trajectory.parse_errors == 1 and trajectory.num_tool_calls == 0
    assert trajectory.metrics["drift_mismatches"] == 0


def test_the_hermes_parser_cannot_read_these_calls(tokenizer: PreTrainedTokenizerBase) -> None:
    # The failure this family fixes: with the qwen25 parser no call runs.
    config = RolloutConfig(tool_parser="qwen25")
    _, trajectory, _ = run_family(tokenizer, CODER_TOOLS, TURNS, PROMPT, config=config)
    assert trajectory.num_tool_calls == 0 and trajectory.parse_errors == 3  # 2 + 1 blocks
