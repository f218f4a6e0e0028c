r"""GLM-4.5 / GLM-4.6 chat-template family.

Turns start with ``<|system|>``, ``<|user|>``, ``<|assistant|>`` and ``<|observation|>``
and have no end token of their own, so the model stops at the token that opens the *next*
turn (``<|observation|>`` after tool calls, ``<|user|>`` after an answer). The template
writes that token itself, so the tool delta starts right after the model's stop token
(``stop_opens_next_turn``). String arguments are written raw and other values as JSON, so
the parser types values by the tool schema and arguments stay objects.

A user message after turns with reasoning makes the template empty their think blocks:
the documented rewrite. The delta after it is found where the two renders agree once the
rewrite is applied to both, and the drift check counts it as expected.
"""

from __future__ import annotations

import re

from ._family import TemplateFamily, TemplateProbe

__all__ = ["FAMILIES", "GLM45"]


def _detect(probe: TemplateProbe) -> bool:
    text = probe.rendered if probe.rendered is not None else probe.template
    return "<|observation|>" in text and "<arg_key>" in text and "<|assistant|>" in text


_THINK = re.compile(r"\n<think>.*?</think>", re.DOTALL)


def _empty_think_blocks(text: str) -> str:
    """GLM's template empties the think blocks of turns before the last user message."""
    return _THINK.sub("\n<think></think>", text)


GLM45 = TemplateFamily(
    name="glm45",
    stop_tokens=("<|observation|>", "<|endoftext|>", "<|user|>"),
    boundary="",
    generation_prompt="<|assistant|>",
    tool_parser="glm45",
    rewrites_history=True,
    history_normalizer=_empty_think_blocks,
    description="GLM-4.5/4.6: <arg_key>/<arg_value> calls, the model stops at the "
    "<|observation|> the template writes to open the tool turn.",
    detect=_detect,
    detect_priority=20,
    stop_opens_next_turn=True,
    arguments_as="object",
    think_tags=("<think>", "</think>"),
    reasoning_field="reasoning_content",
)

FAMILIES: tuple[TemplateFamily, ...] = (GLM45,)
