"""Qwen3-VL Instruct end to end with its official template: tools, images, exactness.

The template renders tools itself (the hermes block of Qwen3), hermes calls, and images
as ``<|vision_start|><|image_pad|><|vision_end|>`` in user turns and inside a tool's
``<tool_response>``. Rule under test: the transcript, each image's run collapsed to one
placeholder, equals ``apply_chat_template(trajectory.messages, tools=...)`` exactly.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from tests.chat.families.qwen_common import (
    qwen_tokenizer,
    run_vision,
    transcript,
    vision_format,
)
from transformers import PreTrainedTokenizerBase

from toolrollout.chat import ChatFormat, VisionFormat
from toolrollout.chat.families import get_template_family
from toolrollout.rollout import RolloutRunner, Trajectory, TrajectoryStatus

PROMPT = [
    {"role": "system", "content": "You are a careful assistant."},
    {"role": "user", "content": "Show me the sky in Paris, the weather there, and 2 + 3."},
]


def hermes(name: str, **arguments: object) -> str:
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


TURNS = [
    "Let me look.\n"
    + hermes("snapshot", city="Paris")
    + "\n"
    + hermes("get_weather", city="Paris")
    + "<|im_end|>",
    hermes("add", a=2, b=3) + "\n" + hermes("snapshot", city="Rome") + "<|im_end|>",
    "Blue skies over Paris and Rome, sunny, and 2 + 3 = 5.<|im_end|>",
]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    return qwen_tokenizer("trl-qwen3_vl.jinja", qwen3=True)


@pytest.fixture(scope="module")
def vision(tokenizer: PreTrainedTokenizerBase) -> VisionFormat:
    return vision_format(tokenizer)


def official_ids(
    tokenizer: PreTrainedTokenizerBase, runner: RolloutRunner, trajectory: Trajectory
) -> list[int]:
    text = tokenizer.apply_chat_template(
        list(trajectory.messages), tools=list(runner.chat.tools), tokenize=False
    )
    assert isinstance(text, str)
    return list(tokenizer.encode(text.removesuffix("\n"), add_special_tokens=False))


def test_detected_from_the_official_template(tokenizer: PreTrainedTokenizerBase) -> None:
    family = ChatFormat(tokenizer).family
    assert family.name == "qwen3_vl" and family.vision and family.tool_parser == "qwen25"


def test_parallel_calls_images_and_exactness(
    tokenizer: PreTrainedTokenizerBase, vision: VisionFormat
) -> None:
    runner, trajectory, engine = run_vision(tokenizer, vision, TURNS, PROMPT)
    assert trajectory.status is TrajectoryStatus.COMPLETED, trajectory.error
    assert trajectory.num_tool_calls == 4 and trajectory.parse_errors == 0
    assert trajectory.tool_errors == 0
    assert trajectory.metrics["drift_mismatches"] == 0
    assert [m["content"] for m in trajectory.messages if m["role"] == "assistant"] == [
        "Let me look.",
        "",
        "Blue skies over Paris and Rome, sunny, and 2 + 3 = 5.",
    ]
    assert len(trajectory.images) == 2
    ids = transcript(trajectory)
    for image in trajectory.images:
        assert image.num_tokens == vision.prepare(image.png).num_tokens > 1
        assert set(ids[image.start : image.end]) == {vision.pad_id}
        assert ids[image.start - 1] == vision.start_id and ids[image.end] == vision.end_id
    assert [len(r.image_data or ()) for r in engine.requests] == [0, 1, 2]
    tools = [m for m in trajectory.messages if m["role"] == "tool"]
    assert tools[0]["content"] == [
        {"type": "image"},
        {"type": "text", "text": "Paris sky\ntaken at noon"},
    ]
    # The picture sits inside the tool's <tool_response>, as the template writes it.
    text = tokenizer.decode(vision.collapse(ids))
    assert "<tool_response>\n<|vision_start|><|image_pad|><|vision_end|>Paris sky" in text
    assert vision.collapse(ids) == official_ids(tokenizer, runner, trajectory)


def test_malformed_call_is_a_counted_parse_error(
    tokenizer: PreTrainedTokenizerBase, vision: VisionFormat
) -> None:
    bad = '<tool_call>\n{"name": "snapshot", "arguments": {"city": }\n</tool_call><|im_end|>'
    _, trajectory, _ = run_vision(tokenizer, vision, [bad, "Sorry.<|im_end|>"], PROMPT)
    assert trajectory.parse_errors == 1 and trajectory.num_tool_calls == 0
    assert trajectory.metrics["drift_mismatches"] == 0


def test_a_wrong_boundary_is_caught(
    tokenizer: PreTrainedTokenizerBase, vision: VisionFormat
) -> None:
    # Sabotage: a family that forgets the "\n" after <|im_end|> fails the trajectory.
    wrong = dataclasses.replace(get_template_family("qwen3_vl"), boundary="")
    _, trajectory, _ = run_vision(tokenizer, vision, TURNS, PROMPT, family=wrong)
    assert trajectory.status is TrajectoryStatus.FAILED
    assert "after the model's stop token" in (trajectory.error or "")
