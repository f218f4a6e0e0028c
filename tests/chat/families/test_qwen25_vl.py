"""Qwen2.5-VL end to end with its official template, which knows no tools.

The template renders each message as ``<|im_start|>ROLE\\n`` + content, images as
``<|vision_start|><|image_pad|><|vision_end|>``, and ignores both ``tools`` and
``tool_calls``. Rules under test:

- detection: the template is recognised (it was refused before) as ``qwen25_vl``;
- tools: the hermes tool block (Qwen2.5's words) is appended to the system message, so the
  model sees its tools; ``Trajectory.messages`` holds that system message too;
- calls: hermes JSON, parsed by ``qwen25``; an assistant message keeps the model's raw text
  (calls included) as content, since that is all the template renders;
- images: a tool's picture is one placeholder per image in the render and the processor's
  count in the transcript;
- exactness: the transcript, with each image's run collapsed to one placeholder, equals a
  plain ``apply_chat_template`` of ``trajectory.messages``.
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from tests.chat.families._scripted_server import scripted_sglang_server
from tests.chat.families.qwen_common import qwen_tokenizer, run_vision, transcript, vision_format
from transformers import PreTrainedTokenizerBase
from typer.testing import CliRunner

from toolrollout.chat import ChatFormat, VisionFormat
from toolrollout.chat.families import get_template_family
from toolrollout.integrations import trl_rollout_func
from toolrollout.rollout import RolloutConfig, TrajectoryStatus
from toolrollout.spec import RunSpec
from toolrollout.testing import ScriptedEngine, ScriptedOutput
from toolrollout.tools import calculator_tool

PROMPT = [
    {"role": "system", "content": "You are a careful assistant."},
    {"role": "user", "content": "Show me the sky in Paris, the weather there, and 2 + 3."},
]

CALCULATOR = RunSpec(tools=[calculator_tool()])


def hermes(name: str, **arguments: object) -> str:
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


TURNS = [
    "Let me look.\n"
    + hermes("snapshot", city="Paris")
    + "\n"
    + hermes("get_weather", city="Paris")
    + "<|im_end|>",
    hermes("add", a=2, b=3) + "<|im_end|>",
    "The sky over Paris is blue, it is sunny, and 2 + 3 = 5.<|im_end|>",
]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    return qwen_tokenizer("trl-qwen2_5_vl.jinja", qwen3=False)


@pytest.fixture(scope="module")
def vision(tokenizer: PreTrainedTokenizerBase) -> VisionFormat:
    return vision_format(tokenizer)


def test_detected_from_the_official_template(tokenizer: PreTrainedTokenizerBase) -> None:
    family = ChatFormat(tokenizer).family
    assert family.name == "qwen25_vl" and family.vision and family.tool_parser == "qwen25"


def plain_render_ids(tokenizer: PreTrainedTokenizerBase, messages: list[Any]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    assert isinstance(text, str)
    return list(tokenizer.encode(text.removesuffix("\n"), add_special_tokens=False))


def test_tools_images_and_exactness(
    tokenizer: PreTrainedTokenizerBase, vision: VisionFormat
) -> None:
    runner, trajectory, engine = run_vision(tokenizer, vision, TURNS, PROMPT)
    assert runner.chat.family.name == "qwen25_vl"
    assert trajectory.status is TrajectoryStatus.COMPLETED, trajectory.error
    assert trajectory.num_tool_calls == 3 and trajectory.parse_errors == 0
    assert trajectory.tool_errors == 0
    assert trajectory.metrics["drift_mismatches"] == 0
    # The model was shown its tools, after the system text, as Qwen2.5 shows them.
    prompt = str(tokenizer.decode(list(engine.requests[0].input_ids)))
    assert prompt.startswith(
        "<|im_start|>system\nYou are a careful assistant.\n\n# Tools\n\nYou may call one or "
        "more functions to assist with the user query."
    )
    for tool in runner.chat.tools:
        assert json.dumps(tool, ensure_ascii=False) in prompt
    system = trajectory.messages[0]
    assert system["role"] == "system" and "<tools>\n" in system["content"]
    # Assistant turns keep their raw text; their calls are listed as well.
    first = trajectory.messages[2]
    assert first["content"] == TURNS[0].removesuffix("<|im_end|>")
    assert [c["function"]["name"] for c in first["tool_calls"]] == ["snapshot", "get_weather"]
    # The picture travelled: one image, as placeholders, sent to the engine.
    [image] = trajectory.images
    assert image.num_tokens == vision.prepare(image.png).num_tokens > 1
    ids = transcript(trajectory)
    assert set(ids[image.start : image.end]) == {vision.pad_id}
    assert ids[image.start - 1] == vision.start_id and ids[image.end] == vision.end_id
    assert [len(r.image_data or ()) for r in engine.requests] == [0, 1, 1]
    snapshot_message = trajectory.messages[3]
    assert snapshot_message["role"] == "tool"
    assert snapshot_message["content"] == [
        {"type": "image"},
        {"type": "text", "text": "Paris sky\ntaken at noon"},
    ]
    # Exact: collapsed to one placeholder per image, the transcript is the official
    # template's render of the messages, with no tools argument and nothing added.
    assert vision.collapse(ids) == plain_render_ids(tokenizer, list(trajectory.messages))


def test_without_a_system_message_one_holds_the_tools(
    tokenizer: PreTrainedTokenizerBase, vision: VisionFormat
) -> None:
    _, trajectory, engine = run_vision(tokenizer, vision, TURNS[-1:], PROMPT[1:])
    assert str(tokenizer.decode(list(engine.requests[0].input_ids))).startswith(
        "<|im_start|>system\n# Tools\n\n"
    )
    assert trajectory.messages[0]["role"] == "system"
    assert transcript(trajectory) == plain_render_ids(tokenizer, list(trajectory.messages))


def test_malformed_call_is_a_counted_parse_error(
    tokenizer: PreTrainedTokenizerBase, vision: VisionFormat
) -> None:
    bad = '<tool_call>\n{"name": "snapshot", "arguments": {"city": }\n</tool_call><|im_end|>'
    _, trajectory, _ = run_vision(tokenizer, vision, [bad, "Sorry.<|im_end|>"], PROMPT)
    assert trajectory.parse_errors == 1 and trajectory.num_tool_calls == 0
    assert trajectory.metrics["drift_mismatches"] == 0


def test_structured_messages_would_not_re_render(
    tokenizer: PreTrainedTokenizerBase, vision: VisionFormat
) -> None:
    # Sabotage: with the default message form (content without the calls) the template,
    # which ignores tool_calls, renders turns the model never wrote.
    plain = dataclasses.replace(get_template_family("qwen25_vl"), assistant_message=None)
    _, trajectory, _ = run_vision(tokenizer, vision, TURNS, PROMPT, family=plain)
    assert trajectory.num_tool_calls == 3 and trajectory.metrics["drift_mismatches"] == 0
    assert trajectory.messages[2]["content"] == "Let me look."
    fresh = plain_render_ids(tokenizer, list(trajectory.messages))
    assert vision.collapse(transcript(trajectory)) != fresh


CALCULATOR_TURNS = [
    hermes("calculator", expression="2 + 3") + "<|im_end|>",
    "The answer is 5.<|im_end|>",
]
CALCULATOR_PROMPT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is 2 + 3?"},
]


def test_generate_cli_and_trl_adapter(tokenizer: PreTrainedTokenizerBase, tmp_path: Path) -> None:
    # The template is detected and run by `toolrollout generate` and the TRL adapter too
    # (here with the calculator and no images; the entry-point test renders each family's
    # turns from its template, which for this one holds no calls).
    from toolrollout.apps.cli import app

    turns = [tokenizer.encode(t, add_special_tokens=False) for t in CALCULATOR_TURNS]
    model_dir = tmp_path / "model"
    tokenizer.save_pretrained(model_dir)
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text(json.dumps({"messages": CALCULATOR_PROMPT, "answer": "5"}) + "\n")
    out = tmp_path / "out.jsonl"
    args = ["generate", "--model", str(model_dir), "--dataset", str(dataset), "--n", "1"]
    args += ["--out", str(out), "--max-turns", "4"]
    stop = ChatFormat(tokenizer).stop_token_ids
    with scripted_sglang_server(turns, stop) as (url, log):
        result = CliRunner().invoke(app, [*args, "--engine-url", url])
    assert result.exit_code == 0, result.output
    [row] = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["status"] == "completed" and row["num_tool_calls"] == 1
    assert row["parse_errors"] == 0 and row["reward"] == 1.0
    assert "# Tools" in tokenizer.decode(log[0]["input_ids"])

    engine = ScriptedEngine([ScriptedOutput(ids) for ids in turns])
    trainer = SimpleNamespace(
        args=SimpleNamespace(max_completion_length=None),
        model=SimpleNamespace(training=True),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
    )
    rollout = trl_rollout_func(
        engine,
        tokenizer,
        RunSpec(tools=[calculator_tool()], config=RolloutConfig(family="qwen25_vl")),
    )
    with rollout:
        batch = rollout([CALCULATOR_PROMPT], trainer)
        [trajectory] = rollout.last_trajectories
    assert trajectory.num_tool_calls == 1 and trajectory.parse_errors == 0
    assert trajectory.metrics["drift_mismatches"] == 0
    assert batch["completion_ids"][0] == list(trajectory.response_ids)
    assert transcript(trajectory) == plain_render_ids(tokenizer, list(trajectory.messages))
