r"""Qwen families: ChatML turns (``<|im_start|>`` … ``<|im_end|>``) and ``<tool_call>`` JSON.

- ``qwen25`` (Qwen2.5): the model stops at ``<|im_end|>``; the template then writes ``\n``
  (boundary), and the next turn starts with ``<|im_start|>``. Tool results are a ``user``
  turn of ``<tool_response>`` blocks; consecutive tool messages share one turn.
- ``qwen3`` (Qwen3): same stop token and boundary. The generation prompt gains
  ``<think>\n\n</think>\n\n`` when ``enable_thinking=False``. Re-rendering drops the
  ``<think>`` block of every assistant turn before the last real user query.
"""

from __future__ import annotations

import re

from .._family import TemplateFamily, TemplateProbe

__all__ = ["FAMILIES", "QWEN3", "QWEN25"]

_THINK_BLOCK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)


def _drop_think_blocks(text: str) -> str:
    """Remove every ``<think>…</think>`` block (and the whitespace after it)."""
    return _THINK_BLOCK.sub("", text)


def _is_chatml_with_tool_call(probe: TemplateProbe) -> bool:
    return probe.mentions("<|im_start|>", "<|im_end|>") and (
        probe.renders("<tool_call>") or probe.mentions("<tool_call>")
    )


def _is_qwen3(probe: TemplateProbe) -> bool:
    return _is_chatml_with_tool_call(probe) and (
        probe.mentions("<think>") or probe.mentions("reasoning_content")
    )


QWEN25 = TemplateFamily(
    name="qwen25",
    stop_tokens=("<|im_end|>",),
    boundary="\n",
    generation_prompt="<|im_start|>assistant\n",
    tool_parser="qwen25",
    description="Qwen2.5 ChatML: tools in the system turn, <tool_call> JSON, "
    "<tool_response> inside a user turn.",
    detect=_is_chatml_with_tool_call,
)

QWEN3 = TemplateFamily(
    name="qwen3",
    stop_tokens=("<|im_end|>",),
    boundary="\n",
    generation_prompt="<|im_start|>assistant\n",
    tool_parser="qwen3",
    rewrites_history=True,
    history_normalizer=_drop_think_blocks,
    description="Qwen3 ChatML: like qwen25, but earlier <think> blocks are dropped on re-render.",
    detect=_is_qwen3,
    detect_priority=10,
    think_tags=("<think>", "</think>"),
    reasoning_field="reasoning_content",
)

FAMILIES: tuple[TemplateFamily, ...] = (QWEN25, QWEN3)
