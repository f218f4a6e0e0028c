r"""The Qwen families: Qwen2.5, Qwen3, Qwen3-Coder, Qwen3.5/3.6, Qwen2.5-VL and Qwen3-VL.

All are ChatML: the model stops at ``<|im_end|>`` and the template writes ``\n`` (the
boundary). Tool results are one ``user`` turn of ``<tool_response>`` blocks, except in
Qwen2.5-VL, whose template knows no tools: it writes a ``tool`` turn per result, so
toolrollout puts the hermes tool block into the system message (``tools_fallback``) and
keeps each model turn's raw text, calls included, as its content. The call formats and
reasoning are in the table of docs/rollouts.md. Arguments are objects: the hermes
templates render ``arguments`` with ``tojson`` even when it is a string (a JSON string
would be encoded twice). The thinking families' documented rewrite: reasoning is rendered
only for the turns after the last real user query, and an empty block (thinking off)
is dropped by a later render.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ._family import TemplateFamily, TemplateProbe, default_assistant_message

if TYPE_CHECKING:
    from ..parsers import ParsedTurn

__all__ = ["FAMILIES", "QWEN3", "QWEN3_CODER", "QWEN3_VL", "QWEN25", "QWEN25_VL", "QWEN35"]

_IM_END = "<|im_end|>"
_GENERATION_PROMPT = "<|im_start|>assistant\n"
_THINK = ("<think>", "</think>")

_THINK_BLOCK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)


def _drop_think_blocks(text: str) -> str:
    """Remove every ``<think>…</think>`` block and the whitespace after it."""
    return _THINK_BLOCK.sub("", text)


def _chatml(probe: TemplateProbe) -> bool:
    return probe.mentions("<|im_start|>", _IM_END)


def _hermes(probe: TemplateProbe) -> bool:
    """The probe's call renders as hermes JSON and its result as ``<tool_response>``.

    When the probe did not render at all, the template text has to do.
    """
    if probe.rendered is None:
        return probe.mentions("<tool_call>")
    return probe.renders('<tool_call>\n{"name": "probe_tool"', "<tool_response>")


def _vision(probe: TemplateProbe) -> bool:
    return probe.mentions("<|image_pad|>")


def _detect_qwen25(probe: TemplateProbe) -> bool:
    return _chatml(probe) and _hermes(probe) and not _vision(probe)


def _detect_qwen3(probe: TemplateProbe) -> bool:
    thinks = probe.mentions("<think>") or probe.mentions("reasoning_content")
    return _detect_qwen25(probe) and thinks


def _detect_qwen3_coder(probe: TemplateProbe) -> bool:
    return _chatml(probe) and (
        probe.renders("<tool_call>\n<function=probe_tool>\n<parameter=x>")
        or probe.mentions("<function=", "<parameter=")
    )


def _detect_qwen35(probe: TemplateProbe) -> bool:
    return _detect_qwen3_coder(probe) and probe.mentions("<think>")


def _detect_qwen25_vl(probe: TemplateProbe) -> bool:
    # A ChatML vision template that drops the call (no <tool_call> in the render) and
    # writes the tool result as a plain ``tool`` turn.
    return (
        _chatml(probe)
        and _vision(probe)
        and probe.renders("<|im_start|>tool\nprobe result")
        and not probe.renders("<tool_call>")
    )


def _detect_qwen3_vl(probe: TemplateProbe) -> bool:
    return _chatml(probe) and _vision(probe) and _hermes(probe)


def hermes_tool_block(tools: Sequence[Mapping[str, Any]]) -> str:
    """The tool block Qwen2.5's own template writes into the system turn.

    Qwen2.5-VL is a Qwen2.5 language model, so it is shown its tools the way Qwen2.5 is:
    the same words, one ``tojson`` schema per line (``ensure_ascii=False``, like the
    ``tojson`` filter of Hugging Face chat templates).
    """
    lines = "".join("\n" + json.dumps(dict(tool), ensure_ascii=False) for tool in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>{lines}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments "
        "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def _raw_text_message(
    text: str, parsed: ParsedTurn, family: TemplateFamily, call_ids: Sequence[str]
) -> dict[str, Any]:
    """Qwen2.5-VL: the template renders only ``content``, so content is the raw text.

    The calls are listed in ``tool_calls`` too (the template ignores them), so readers of
    ``Trajectory.messages`` find them with their ids; reasoning has no field of its own.
    """
    message = default_assistant_message(text, parsed, family, call_ids)
    message["content"] = text
    return message


QWEN25 = TemplateFamily(
    name="qwen25",
    stop_tokens=(_IM_END,),
    boundary="\n",
    generation_prompt=_GENERATION_PROMPT,
    tool_parser="qwen25",
    description="Qwen2.5 ChatML: tools in the system turn, <tool_call> JSON, "
    "<tool_response> inside a user turn.",
    detect=_detect_qwen25,
    detect_priority=0,
    arguments_as="object",
)

QWEN3 = dataclasses.replace(
    QWEN25,
    name="qwen3",
    tool_parser="qwen3",
    rewrites_history=True,
    history_normalizer=_drop_think_blocks,
    description="Qwen3 ChatML: like qwen25, with <think> reasoning in reasoning_content; "
    "earlier think blocks (and the empty one of enable_thinking=False) are dropped on "
    "re-render.",
    detect=_detect_qwen3,
    detect_priority=10,
    think_tags=_THINK,
    reasoning_field="reasoning_content",
)

QWEN3_CODER = dataclasses.replace(
    QWEN25,
    name="qwen3_coder",
    tool_parser="qwen3_coder",
    description="Qwen3-Coder ChatML: XML calls <tool_call><function=NAME><parameter=KEY>, "
    "values typed by the tool schema.",
    detect=_detect_qwen3_coder,
    detect_priority=20,
)

QWEN35 = dataclasses.replace(
    QWEN25,
    name="qwen35",
    generation_prompt=_GENERATION_PROMPT + "<think>\n",
    tool_parser="qwen3_coder",
    rewrites_history=True,
    history_normalizer=_drop_think_blocks,
    description="Qwen3.5/3.6 ChatML: Qwen3-Coder XML calls, <think> reasoning in "
    "reasoning_content (dropped before the last user query on re-render), images.",
    detect=_detect_qwen35,
    detect_priority=25,
    think_tags=_THINK,
    reasoning_field="reasoning_content",
    vision=True,
)

QWEN25_VL = dataclasses.replace(
    QWEN25,
    name="qwen25_vl",
    tool_parser="qwen25",
    description="Qwen2.5-VL ChatML: the template has no tools, so the hermes tool block goes "
    "into the system message; model turns keep their raw text; image placeholders.",
    detect=_detect_qwen25_vl,
    detect_priority=20,
    assistant_message=_raw_text_message,
    tools_fallback=hermes_tool_block,
    vision=True,
)

QWEN3_VL = dataclasses.replace(
    QWEN25,
    name="qwen3_vl",
    tool_parser="qwen25",
    description="Qwen3-VL Instruct ChatML: hermes calls, images in user turns and tool results.",
    detect=_detect_qwen3_vl,
    detect_priority=20,
    vision=True,
)

FAMILIES: tuple[TemplateFamily, ...] = (
    QWEN25,
    QWEN3,
    QWEN3_CODER,
    QWEN35,
    QWEN25_VL,
    QWEN3_VL,
)
