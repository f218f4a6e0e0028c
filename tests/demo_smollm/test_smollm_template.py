"""toolrollout's tools template for SmolLM2, with the model's real tokenizer: exact.

Scripted model turns (calls to the real calculator, an answer) go through a real
``RolloutRunner``; the trajectory's ids must equal a fresh render of its own messages,
and the model's tokens must be in it verbatim.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from tests.chat.families.conftest import fresh_render_ids, run_family

from toolrollout.apps.demo_smollm import SMOLLM2_CHAT_TEMPLATE_PATH
from toolrollout.chat import ChatFormat
from toolrollout.chat.families import detect_template_family, get_template_family
from toolrollout.rollout import RolloutConfig, TrajectoryStatus
from toolrollout.tools import calculator_tool

PROMPT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is 347 * 29, plus 5?"},
]


def call(expression: str) -> str:
    body = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
    return f"<tool_call>\n{body}\n</tool_call>"


TURNS = [
    call("347 * 29") + "<|im_end|>",
    "Now the sum.\n" + call("10063 + 5") + "<|im_end|>",
    "347 * 29 = 10063, and plus 5 that is 10068.<|im_end|>",
]


def test_shipped_template_is_detected_as_smollm2() -> None:
    family = detect_template_family(SMOLLM2_CHAT_TEMPLATE_PATH.read_text(encoding="utf-8"))
    assert family.name == "smollm2"
    assert family is get_template_family("smollm2")
    assert family.stop_tokens == ("<|im_end|>",) and family.boundary == "\n"


def test_real_tokenizer_renders_the_smollm2_family(smollm2_tokenizer: Any) -> None:
    assert ChatFormat(smollm2_tokenizer).family.name == "smollm2"
    schema = calculator_tool().schema()
    text = smollm2_tokenizer.apply_chat_template(
        PROMPT, tools=[schema], tokenize=False, add_generation_prompt=True
    )
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.")
    assert '{"name": "calculator"' in text and text.endswith("<|im_start|>assistant\n")
    # without tools and without a system message: SmolLM2's own default system line
    plain = smollm2_tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert plain == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
        "Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_multi_turn_calculator_rollout_is_token_exact(smollm2_tokenizer: Any) -> None:
    runner, trajectory, engine = run_family(
        smollm2_tokenizer, [calculator_tool()], TURNS, PROMPT, config=RolloutConfig(max_turns=4)
    )
    assert runner.chat.family.name == "smollm2" and runner.parser.name == "hermes"
    assert trajectory.status is TrajectoryStatus.COMPLETED, trajectory.error
    assert trajectory.num_tool_calls == 2 and trajectory.parse_errors == 0
    assert trajectory.tool_errors == 0
    assert [m["content"] for m in trajectory.messages if m["role"] == "tool"] == ["10063", "10068"]
    assert trajectory.metrics["drift_mismatches"] == 0
    assert trajectory.metrics["drift_expected"] == 0
    ids = list(trajectory.prompt_ids) + list(trajectory.response_ids)
    assert ids == fresh_render_ids(smollm2_tokenizer, runner, trajectory)
    # each result is a tool turn of its own, after the boundary the model never wrote
    text = smollm2_tokenizer.decode(ids)
    assert "<|im_end|>\n<|im_start|>tool\n10063<|im_end|>\n<|im_start|>assistant\n" in text
    masked = [t for t, m in zip(trajectory.response_ids, trajectory.loss_mask, strict=True) if m]
    encode = smollm2_tokenizer.encode
    assert masked == [t for turn in TURNS for t in encode(turn, add_special_tokens=False)]
    assert len(engine.requests) == len(TURNS)


@pytest.mark.parametrize("name", ["smollm2"])
def test_family_selected_by_name(smollm2_tokenizer: Any, name: str) -> None:
    assert ChatFormat(smollm2_tokenizer, family=name).family.name == name
