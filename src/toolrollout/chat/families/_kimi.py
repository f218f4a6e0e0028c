r"""Kimi-K2 chat-template family.

The model stops at ``<|im_end|>`` and the template writes nothing after it (boundary
``""``). The model writes each call's id itself (``functions.NAME:IDX``); the parser keeps
it and the template writes it back in the call and in the tool turn's ``## Return of ID``
line, so ids round-trip without a ``call_id`` rule.

K2-Thinking's template renders ``reasoning_content`` only for turns after the last
assistant turn without tool calls, so once a trajectory ends with a final answer every
turn re-renders as ``<think></think>…``: the documented rewrite. Arguments are JSON strings
(K2-Thinking prints them as given; ``ChatFormat`` finds by rendering that K2-Instruct's
first template needs objects). The drift check renders the structured messages
(``drift_from_raw_text=False``), so argument JSON spaced unlike ``json.dumps`` shows up as
text drift.
"""

from __future__ import annotations

import re

from ._family import TemplateFamily, TemplateProbe

__all__ = ["FAMILIES", "KIMI_K2"]

_SECTION = "<|tool_calls_section_begin|>"


def _detect(probe: TemplateProbe) -> bool:
    if probe.rendered is not None and "<|im_assistant|>" in probe.rendered:
        return _SECTION in probe.rendered
    return "<|im_assistant|>" in probe.template and _SECTION in probe.template


_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)


def _empty_think_blocks(text: str) -> str:
    """Kimi's template empties the think blocks of turns before the last final answer."""
    return _THINK.sub("<think></think>", text)


KIMI_K2 = TemplateFamily(
    name="kimi_k2",
    stop_tokens=("<|im_end|>",),
    boundary="",
    generation_prompt="<|im_assistant|>assistant<|im_middle|>",
    tool_parser="kimi_k2",
    rewrites_history=True,
    history_normalizer=_empty_think_blocks,
    description="Kimi-K2: <|tool_calls_section_begin|> calls with functions.NAME:IDX ids, "
    "'## Return of ID' tool turns, think blocks emptied before the last answer.",
    detect=_detect,
    detect_priority=20,
    arguments_as="json",
    think_tags=("<think>", "</think>"),
    reasoning_field="reasoning_content",
    # Raw text as content would make a call turn look like a final answer to the template
    # (which then empties its think block): compare the structured messages instead.
    drift_from_raw_text=False,
)

FAMILIES: tuple[TemplateFamily, ...] = (KIMI_K2,)
