"""Qwen2.5 end to end with its official template: detection, parallel calls, exactness.

Rule under test: ``qwen25`` transcripts are token-exact. The ids of a finished trajectory
equal a fresh ``apply_chat_template`` of its own ``messages`` (arguments as objects, since
the template ``tojson``-encodes them) with nothing normalised.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from tests.chat.families.conftest import fresh_render_ids, run_family
from tests.chat.families.qwen_common import TOOLS, fresh_official_ids, qwen_tokenizer, transcript
from transformers import PreTrainedTokenizerBase

from toolrollout.chat import ChatFormat
from toolrollout.chat.families import get_template_family
from toolrollout.rollout import RolloutConfig, TrajectoryStatus

TEMPLATE = "Qwen-Qwen2.5-7B-Instruct.jinja"
PROMPT = [
    {"role": "system", "content": "You are a careful assistant."},
    {"role": "user", "content": "What is 2 + 3, and the weather in Paris?"},
]


def hermes(name: str, **arguments: object) -> str:
    """A call as the Qwen2.5 template writes it (``tojson`` spacing)."""
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


TURNS = [
    "Let me look both up.\n"
    + hermes("add", a=2, b=3)
    + "\n"
    + hermes("get_weather", city="Paris")
    + "<|im_end|>",
    hermes("add", a=5, b=1) + "<|im_end|>",
    "2 + 3 = 5 (plus one is 6), and Paris is sunny.<|im_end|>",
]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    return qwen_tokenizer(TEMPLATE, qwen3=False)


def test_detected_from_the_official_template(tokenizer: PreTrainedTokenizerBase) -> None:
    assert ChatFormat(tokenizer).family.name == "qwen25"


def test_multi_turn_parallel_calls_token_exact(tokenizer: PreTrainedTokenizerBase) -> None:
    runner, trajectory, engine = run_family(tokenizer, TOOLS, TURNS, PROMPT)
    assert runner.chat.family.name == "qwen25" and runner.parser.name == "hermes"
    assert trajectory.status is TrajectoryStatus.COMPLETED, trajectory.error
    assert trajectory.num_tool_calls == 3 and trajectory.parse_errors == 0
    assert trajectory.metrics["drift_mismatches"] == 0
    assert trajectory.metrics["drift_expected"] == 0
    tool_texts = [m["content"] for m in trajectory.messages if m["role"] == "tool"]
    assert tool_texts == [
        "5",
        "Paris: sunny, 21 C\nwind: 5 km/h from the west\nhumidity: 40%",
        "6",
    ]
    first = trajectory.messages[2]
    assert first["content"] == "Let me look both up."
    assert first["tool_calls"][0]["function"]["arguments"] == {"a": 2, "b": 3}
    assert "raw_content" not in first
    # Exact: the transcript is what the official template renders for the messages.
    assert transcript(trajectory) == fresh_official_ids(tokenizer, trajectory, runner.chat.tools)
    assert transcript(trajectory) == fresh_render_ids(tokenizer, runner, trajectory)
    # The model's ids went in verbatim; only they are trained on.
    masked = [t for t, m in zip(trajectory.response_ids, trajectory.loss_mask, strict=True) if m]
    assert masked == [t for turn in TURNS for t in tokenizer.encode(turn, add_special_tokens=False)]
    assert len(engine.requests) == len(TURNS)


def test_malformed_call_is_a_counted_parse_error(tokenizer: PreTrainedTokenizerBase) -> None:
    bad = '<tool_call>\n{"name": "add", "arguments": {"a": 2,}}\n</tool_call><|im_end|>'
    _, trajectory, _ = run_family(tokenizer, TOOLS, [bad, "Sorry.<|im_end|>"], PROMPT)
    assert trajectory.parse_errors == 1 and trajectory.num_tool_calls == 0
    assert trajectory.messages[2]["content"] == bad.removesuffix("<|im_end|>")
    assert trajectory.metrics["drift_mismatches"] == 0


def test_a_wrong_boundary_is_caught(tokenizer: PreTrainedTokenizerBase) -> None:
    # Sabotage: a family that forgets the "\n" after <|im_end|> must not pass silently.
    wrong = dataclasses.replace(get_template_family("qwen25"), name="qwen25_wrong", boundary="")
    config = RolloutConfig(family=None)
    runner, trajectory, _ = run_family(tokenizer, TOOLS, TURNS, PROMPT, config=config)
    assert transcript(trajectory) == fresh_official_ids(tokenizer, trajectory, runner.chat.tools)
    broken = ChatFormat(tokenizer, tools=runner.chat.tools, family=wrong)
    with pytest.raises(Exception, match="after the model's stop token"):
        broken.tool_turn_delta(trajectory.messages[:3], [trajectory.messages[3]])
