"""What the Qwen family tests share: tokenizers with Qwen's real control tokens, tools.

The token lists are the ones in Qwen's ``tokenizer_config.json`` files: the ChatML and
vision tokens are *special* (they split any text), the tool and think tags are added but
not special, exactly as the released tokenizers have them. Qwen2.5 (and Qwen2.5-VL) has
``<tool_call>``/``</tool_call>`` only; Qwen3 (and Qwen3-Coder, Qwen3-VL) adds
``<tool_response>``, ``</tool_response>``, ``<think>`` and ``</think>``.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import anyio
from tests.chat.families.conftest import build_tokenizer, official_template
from transformers import PreTrainedTokenizerBase

from toolrollout.apps.demo_vl import DEMO_VL_MODEL_PATH
from toolrollout.chat import ChatFormat, TemplateFamily, VisionFormat
from toolrollout.rollout import RolloutConfig, RolloutRunner, Trajectory
from toolrollout.testing import ScriptedEngine, ScriptedOutput
from toolrollout.tools import Tool, ToolResult, function_tool

QWEN_SPECIAL = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
QWEN25_ADDED = [
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
]
QWEN3_ADDED = [*QWEN25_ADDED, "<tool_response>", "</tool_response>", "<think>", "</think>"]


def qwen_tokenizer(template_file: str, *, qwen3: bool) -> PreTrainedTokenizerBase:
    """A small trained tokenizer with Qwen's tokens and the vendored official template."""
    return build_tokenizer(
        special=QWEN_SPECIAL,
        added=QWEN3_ADDED if qwen3 else QWEN25_ADDED,
        template=official_template(template_file),
        eos="<|im_end|>",
    )


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def get_weather(city: str) -> str:
    """Current weather in a city, one fact per line."""
    return f"{city}: sunny, 21 C\nwind: 5 km/h from the west\nhumidity: 40%"


def _png(colour: str, size: tuple[int, int]) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="PNG")
    return buffer.getvalue()


def snapshot(city: str) -> ToolResult:
    """A camera picture of a city's sky, with a caption."""
    return ToolResult(text=f"{city} sky\ntaken at noon", images=(_png("blue", (84, 56)),))


TOOLS: list[Tool] = [function_tool(add), function_tool(get_weather)]
VISION_TOOLS: list[Tool] = [*TOOLS, function_tool(snapshot)]


def fresh_official_ids(
    tokenizer: PreTrainedTokenizerBase, trajectory: Trajectory, tools: Sequence[dict[str, Any]]
) -> list[int]:
    """``trajectory.messages`` rendered by ``tokenizer.apply_chat_template`` and tokenized.

    No toolrollout code is involved: the official template renders the messages as any
    trainer would. The boundary after a final assistant turn is cut, as in the transcript.
    """
    text = tokenizer.apply_chat_template(
        list(trajectory.messages), tools=list[Any](tools), tokenize=False
    )
    assert isinstance(text, str)
    text = text.removesuffix("\n")
    return list(tokenizer.encode(text, add_special_tokens=False))


def transcript(trajectory: Trajectory) -> list[int]:
    """Prompt and response ids, in order."""
    return list(trajectory.prompt_ids) + trajectory.response_ids


def vision_format(tokenizer: PreTrainedTokenizerBase) -> VisionFormat:
    """The placeholder rules of this tokenizer with Qwen2-VL image-processor settings.

    The settings are the VL demo model's ``preprocessor_config.json``
    (``Qwen2VLImageProcessor``: 14-pixel patches merged 2 x 2, the class Qwen2.5-VL uses);
    :class:`VisionFormat` reads only them, so the processor itself (and torch) is not loaded.
    """
    config = json.loads((DEMO_VL_MODEL_PATH / "preprocessor_config.json").read_text())
    return VisionFormat(tokenizer, SimpleNamespace(**config))


def run_vision(
    tokenizer: PreTrainedTokenizerBase,
    vision: VisionFormat,
    model_turns: Sequence[str],
    prompt: Sequence[dict[str, Any]],
    *,
    family: TemplateFamily | None = None,
    config: RolloutConfig | None = None,
) -> tuple[RolloutRunner, Trajectory, ScriptedEngine]:
    """Like ``run_family``, with images from tools turned on (and ``family`` forced)."""
    outputs = [ScriptedOutput(tokenizer.encode(t, add_special_tokens=False)) for t in model_turns]
    engine = ScriptedEngine(outputs)
    runner = RolloutRunner(engine, tokenizer, VISION_TOOLS, vision=vision, config=config)
    if family is not None:
        kwargs = runner.config.chat_template_kwargs
        runner.chat = ChatFormat(
            tokenizer, tools=runner.chat.tools, family=family, template_kwargs=kwargs
        )
    [trajectory] = anyio.run(runner.run, [list(prompt)])
    return runner, trajectory, engine
