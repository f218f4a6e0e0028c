r"""DeepSeek-V3 and DeepSeek-V3.1 chat-template families.

Both end every assistant turn with ``<｜end▁of▁sentence｜>`` and write nothing after it
(boundary ``""``) and no generation prompt after tool results. Both templates print
``tool_call.function.arguments`` as given (``arguments_as="json"``) and ignore ``tools``,
so the schemas go into the system prompt in the DeepSeek-V3.1 model card's layout.

- ``deepseekv3`` (V3 / R1): ``function<｜tool▁sep｜>NAME`` calls with a json fence, tool
  results merged into one ``<｜tool▁outputs▁begin｜>`` block. Its documented rewrite: think
  blocks dropped on re-render, and a second tool-call turn re-rendered without its section
  opener (the template never resets its first-call flag).
- ``deepseekv31``: ``NAME<｜tool▁sep｜>{…}`` calls chained without separators. The
  ``thinking`` template kwarg picks the generation prompt; a re-rendered assistant turn
  always reads ``<｜Assistant｜></think>`` plus the text after the model's ``</think>``.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ._family import TemplateFamily, TemplateProbe

__all__ = [
    "DEEPSEEKV3",
    "DEEPSEEKV31",
    "FAMILIES",
    "deepseek_v3_tool_prompt",
    "deepseek_v31_tool_prompt",
]

_EOS = "<｜end▁of▁sentence｜>"
_ASSISTANT = "<｜Assistant｜>"
_CALL_OPEN = "<｜tool▁call▁begin｜>"


def _detector(rendered_call: str, template_text: str) -> Callable[[TemplateProbe], bool]:
    """Detection by the probe's rendered call, else by how the template text writes one
    (V3: ``'<｜tool▁sep｜>' + tool['function']['name']``, V3.1 the name first)."""
    rendered_pattern, text_pattern = re.compile(rendered_call), re.compile(template_text)

    def detect(probe: TemplateProbe) -> bool:
        if probe.rendered is not None and _CALL_OPEN in probe.rendered:
            return rendered_pattern.search(probe.rendered) is not None
        return text_pattern.search(probe.template) is not None

    return detect


_detect_v3 = _detector(
    r"<｜tool▁sep｜>[^\n<]*\n```json\n", r"'<｜tool▁sep｜>'\s*\+\s*tool\['function'\]\['name'\]"
)
_detect_v31 = _detector(
    r"<｜tool▁call▁begin｜>[^<\n]+<｜tool▁sep｜>\s*\{",
    r"tool\['function'\]\['name'\]\s*\+\s*'<｜tool▁sep｜>'",
)


_V3_THINK = re.compile(r"(<｜Assistant｜>)(?:<think>.*?</think>)?\s*", re.DOTALL)


def _v3_history(text: str) -> str:
    """The V3 template's re-render differences, undone: each think block (and the blank
    after it) goes, and as the template re-renders a later tool-call turn right after the
    previous outputs (its first-call flag is never reset), the transcript's
    ``<｜tool▁outputs▁end｜><｜tool▁calls▁begin｜>`` becomes ``\n``."""
    text = _V3_THINK.sub(r"\1", text)
    return text.replace("<｜tool▁outputs▁end｜><｜tool▁calls▁begin｜>", "\n")


_V31_THINK = re.compile(r"<｜Assistant｜>(?:<think>.*?)?</think>", re.DOTALL)


def _v31_history(text: str) -> str:
    """V3.1 re-renders ``<｜Assistant｜><think>…</think>`` as ``<｜Assistant｜></think>``."""
    return _V31_THINK.sub("<｜Assistant｜></think>", text)


_V31_FORMAT = (
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>"
    "tool_call_arguments<｜tool▁call▁end｜>{{additional_tool_calls}}<｜tool▁calls▁end｜>"
)
_V3_FORMAT = (
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>tool_call_name\n"
    "```json\ntool_call_arguments\n```<｜tool▁call▁end｜>{{additional_tool_calls}}"
    "<｜tool▁calls▁end｜>"
)


def _tool_prompt(tools: Sequence[Mapping[str, Any]], call_format: str, chaining: str) -> str:
    sections = []
    for tool in tools:
        function = tool.get("function", tool)
        sections.append(
            f"### {function.get('name', '')}\n"
            f"Description: {function.get('description', '')}\n\n"
            f"Parameters: {json.dumps(function.get('parameters', {}), ensure_ascii=False)}\n"
        )
    return (
        "## Tools\nYou have access to the following tools:\n\n"
        + "\n".join(sections)
        + f"\nIMPORTANT: ALWAYS adhere to this exact format for tool use:\n{call_format}\n\n"
        "Where:\n\n"
        "- `tool_call_name` must be an exact match to one of the available tools\n"
        "- `tool_call_arguments` must be valid JSON that strictly follows the tool's "
        "Parameters Schema\n"
        f"- {chaining}\n"
    )


def deepseek_v31_tool_prompt(tools: Sequence[Mapping[str, Any]]) -> str:
    """The tool description the DeepSeek-V3.1 model card puts after the system prompt (one
    ``### name`` section per tool, then the call-format reminder), written from the card."""
    return _tool_prompt(
        tools,
        _V31_FORMAT,
        "For multiple tool calls, chain them directly without separators or spaces",
    )


def deepseek_v3_tool_prompt(tools: Sequence[Mapping[str, Any]]) -> str:
    """The same description with DeepSeek-V3's fenced call format (no model card states a
    tool prompt for V3, whose template ignores ``tools`` too)."""
    return _tool_prompt(tools, _V3_FORMAT, "For multiple tool calls, put each on its own line")


DEEPSEEKV3 = TemplateFamily(
    name="deepseekv3",
    stop_tokens=(_EOS,),
    boundary="",
    generation_prompt=f"{_ASSISTANT}<think>\n",
    tool_parser="deepseekv3",
    rewrites_history=True,
    history_normalizer=_v3_history,
    description="DeepSeek-V3 / R1: fenced ```json calls after function<｜tool▁sep｜>NAME, "
    "tool outputs merged in <｜tool▁outputs▁begin｜>, think blocks dropped on re-render.",
    detect=_detect_v3,
    detect_priority=20,
    arguments_as="json",
    think_tags=("<think>", "</think>"),
    reasoning_field="reasoning_content",
    tools_fallback=deepseek_v3_tool_prompt,
)

DEEPSEEKV31 = dataclasses.replace(
    DEEPSEEKV3,
    name="deepseekv31",
    generation_prompt=f"{_ASSISTANT}</think>",
    tool_parser="deepseekv31",
    history_normalizer=_v31_history,
    description="DeepSeek-V3.1: NAME<｜tool▁sep｜>{json} calls, 'thinking' kwarg, tool "
    "schemas in the system prompt (the template ignores tools).",
    detect=_detect_v31,
    tools_fallback=deepseek_v31_tool_prompt,
)

FAMILIES: tuple[TemplateFamily, ...] = (DEEPSEEKV3, DEEPSEEKV31)
