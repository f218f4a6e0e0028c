"""Qwen3.5 and Qwen3.6 end to end: Qwen3-Coder's XML calls with Qwen3's reasoning.

Their templates open the think block in the generation prompt (``<think>\\n``; the empty
``<think>\\n\\n</think>\\n\\n`` with ``enable_thinking=False``), write calls as
``<tool_call>\\n<function=NAME>\\n<parameter=KEY>…``, and re-render every turn after the last
user query with its think block (from ``reasoning_content``), so within one query the
transcript is token-exact, thinking on or off. Images in tool results go inside
``<tool_response>``. The tokenizer holds Qwen3's control tokens, which are the strings these
templates write.
"""

from __future__ import annotations

from typing import Any

import pytest
from tests.chat.families.qwen_common import qwen_tokenizer, run_vision, transcript, vision_format
from transformers import PreTrainedTokenizerBase

from toolrollout.chat import ChatFormat, VisionFormat
from toolrollout.rollout import RolloutConfig, Trajectory, TrajectoryStatus

TEMPLATES = ["trl-qwen3_5_think.jinja", "trl-qwen3_6.jinja"]
PROMPT = [
    {"role": "system", "content": "You are a careful assistant."},
    {"role": "user", "content": "Show me the sky in Paris, the weather there, and 2 + 3."},
]


def xml_call(name: str, **params: str) -> str:
    body = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


CALLS_1 = xml_call("snapshot", city="Paris") + "\n" + xml_call("add", a="2", b="3")
CALLS_2 = xml_call("get_weather", city="Paris")
ANSWER = "The sky over Paris is blue, it is sunny, and 2 + 3 = 5."
THINKING = [
    "I need the sky and the sum.\n</think>\n\nLet me look.\n\n" + CALLS_1 + "<|im_end|>",
    "Now the weather.\n</think>\n\n" + CALLS_2 + "<|im_end|>",
    "All facts are in.\n</think>\n\n" + ANSWER + "<|im_end|>",
]
NOT_THINKING = [
    "Let me look.\n\n" + CALLS_1 + "<|im_end|>",
    CALLS_2 + "<|im_end|>",
    ANSWER + "<|im_end|>",
]


@pytest.fixture(scope="module", params=TEMPLATES)
def tokenizer(request: pytest.FixtureRequest) -> PreTrainedTokenizerBase:
    return qwen_tokenizer(request.param, qwen3=True)


@pytest.fixture(scope="module")
def vision(tokenizer: PreTrainedTokenizerBase) -> VisionFormat:
    return vision_format(tokenizer)


def official_ids(
    tokenizer: PreTrainedTokenizerBase, trajectory: Trajectory, tools: list[Any], **kwargs: Any
) -> list[int]:
    text = tokenizer.apply_chat_template(
        list(trajectory.messages), tools=tools, tokenize=False, **kwargs
    )
    assert isinstance(text, str)
    return list(tokenizer.encode(text.removesuffix("\n"), add_special_tokens=False))


def test_detected_from_the_official_templates(tokenizer: PreTrainedTokenizerBase) -> None:
    family = ChatFormat(tokenizer).family
    assert family.name == "qwen35" and family.tool_parser == "qwen3_coder"


@pytest.mark.parametrize("thinking", [True, False])
def test_xml_calls_reasoning_images_token_exact(
    tokenizer: PreTrainedTokenizerBase, vision: VisionFormat, thinking: bool
) -> None:
    kwargs = {} if thinking else {"enable_thinking": False}
    config = RolloutConfig(chat_template_kwargs=kwargs)
    turns = THINKING if thinking else NOT_THINKING
    runner, trajectory, engine = run_vision(tokenizer, vision, turns, PROMPT, config=config)
    assert runner.parser.name == "qwen3_coder"
    assert trajectory.status is TrajectoryStatus.COMPLETED, trajectory.error
    assert trajectory.num_tool_calls == 3 and trajectory.parse_errors == 0
    assert trajectory.tool_errors == 0
    assert trajectory.metrics["drift_mismatches"] == 0
    assistants = [m for m in trajectory.messages if m["role"] == "assistant"]
    assert [m["content"] for m in assistants] == ["Let me look.", "", ANSWER]
    reasoning = [m.get("reasoning_content") for m in assistants]
    if thinking:
        assert reasoning == ["I need the sky and the sum.", "Now the weather.", "All facts are in."]
    else:
        assert reasoning == [None, None, None]
    assert assistants[0]["tool_calls"][1]["function"] == {
        "name": "add",
        "arguments": {"a": 2, "b": 3},
    }
    [image] = trajectory.images
    ids = transcript(trajectory)
    assert set(ids[image.start : image.end]) == {vision.pad_id}
    assert [len(r.image_data or ()) for r in engine.requests] == [0, 1, 1]
    assert vision.collapse(ids) == official_ids(
        tokenizer, trajectory, list(runner.chat.tools), **kwargs
    )


def test_malformed_call_is_a_counted_parse_error(
    tokenizer: PreTrainedTokenizerBase, vision: VisionFormat
) -> None:
    bad = "Go.\n</think>\n\n<tool_call>\n<function=add>\n<parameter=a>\n2\n</tool_call><|im_end|>"
    _, trajectory, _ = run_vision(
        tokenizer, vision, [bad, "x\n</think>\n\nSorry.<|im_end|>"], PROMPT
    )
    assert trajectory.parse_errors == 1 and trajectory.num_tool_calls == 0
    assert trajectory.metrics["drift_mismatches"] == 0
