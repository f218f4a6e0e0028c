r"""Chat-template families and their turn-boundary rules.

A rollout keeps one token transcript per trajectory. The prompt is rendered once; every
model turn is appended **verbatim** from the engine's output ids; every tool turn is
appended as the token **delta** that the chat template adds for the new messages plus the
next generation prompt. The delta must also carry the *boundary*: text that the template
writes after the model's stop token but that the model itself never emits (it stops *at*
the stop token). Forgetting it is the classic multi-turn bug (verl #3720, verl PR #6921):
the trained sequence then differs from what a fresh render would give the model.

Boundary rules
--------------

- ``qwen25`` (Qwen2.5): the model stops at ``<|im_end|>``; the template then writes
  ``\n`` (boundary), and the next turn starts with ``<|im_start|>``. Tool results are a
  ``user`` turn of ``<tool_response>`` blocks; consecutive tool messages share one turn.
  Generation prompt: ``<|im_start|>assistant\n``.
- ``qwen3`` (Qwen3): same stop token and boundary (``\n``). Generation prompt:
  ``<|im_start|>assistant\n``, plus ``<think>\n\n</think>\n\n`` when
  ``enable_thinking=False``.
- ``llama3`` (Llama 3.1 / 3.2): the model stops at ``<|eot_id|>`` (``<|eom_id|>`` after
  a ``<|python_tag|>`` built-in tool call); the template writes **nothing** after it, the
  next turn starts directly with ``<|start_header_id|>``. Tool results are an ``ipython``
  turn each. Generation prompt: ``<|start_header_id|>assistant<|end_header_id|>\n\n``.

The boundary tokens belong to the **tool delta**, with loss mask 0: the model never
sampled them, so it must not be trained on them, yet the next turn must see them because
a fresh render of the conversation contains them. For reference, other families that are
not built in follow the same rule: Mistral (``</s>``, then ``[INST]`` with no boundary),
DeepSeek-V3 (``<｜end▁of▁sentence｜>``, no boundary), GLM-4 (the model stops at
``<|observation|>``, which the template itself writes as the start of the tool turn, so
the delta must *start after* it).

History rewrites
----------------

``qwen3`` templates drop the ``<think>…</think>`` block of every assistant turn that comes
before the last real user query, and normalise the whitespace around it. A fresh render is
therefore not a prefix of a later render, which is why the transcript is kept in tokens
and never re-rendered. :func:`~toolrollout.chat.check_drift` reports that difference as
``history_rewrite`` instead of as an error. The same holds for Llama 3 turns that the model
ended with ``<|eom_id|>``: the template re-renders them with ``<|eot_id|>``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from .._exceptions import UserError

__all__ = [
    "TemplateFamily",
    "detect_template_family",
    "get_template_family",
    "template_families",
]


@dataclass(frozen=True, slots=True)
class TemplateFamily:
    """The facts about one chat-template family that token deltas depend on."""

    name: str
    """Registry name, e.g. ``"qwen25"``."""
    stop_tokens: tuple[str, ...]
    """End-of-turn tokens the model emits, primary first. Each must be a single token."""
    boundary: str
    """Text the template writes right after the stop token that the model never emits."""
    generation_prompt: str
    """What ``add_generation_prompt=True`` appends (documentation and sanity checks)."""
    tool_parser: str
    """Name of the default tool-call parser for this family (see ``get_tool_parser``)."""
    rewrites_history: bool = False
    """True when re-rendering changes earlier turns (so a fresh render is not prefix-stable)."""
    history_normalizer: Callable[[str], str] | None = None
    """Maps a rendered text to a form in which the family's known, benign re-render
    differences vanish (Qwen3 think stripping; Llama's ``<|eom_id|>`` becoming
    ``<|eot_id|>``), so ``check_drift`` can report them as ``history_rewrite``."""
    description: str = ""
    """One line for docs and error messages."""


_THINK_BLOCK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)


def _drop_think_blocks(text: str) -> str:
    """Remove every ``<think>…</think>`` block (and the whitespace after it)."""
    return _THINK_BLOCK.sub("", text)


def _eom_as_eot(text: str) -> str:
    """Llama templates re-render a ``<|eom_id|>`` turn end as ``<|eot_id|>`` for JSON tools."""
    return text.replace("<|eom_id|>", "<|eot_id|>")


QWEN25 = TemplateFamily(
    name="qwen25",
    stop_tokens=("<|im_end|>",),
    boundary="\n",
    generation_prompt="<|im_start|>assistant\n",
    tool_parser="qwen25",
    description="Qwen2.5 ChatML: tools in the system turn, <tool_call> JSON, "
    "<tool_response> inside a user turn.",
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
)

LLAMA3 = TemplateFamily(
    name="llama3",
    stop_tokens=("<|eot_id|>", "<|eom_id|>"),
    boundary="",
    generation_prompt="<|start_header_id|>assistant<|end_header_id|>\n\n",
    tool_parser="llama3",
    history_normalizer=_eom_as_eot,
    description="Llama 3.1/3.2: header tokens, JSON calls with 'parameters', ipython tool role.",
)

_FAMILIES: Mapping[str, TemplateFamily] = MappingProxyType(
    {family.name: family for family in (LLAMA3, QWEN25, QWEN3)}
)


def template_families() -> Mapping[str, TemplateFamily]:
    """The built-in families by name (a read-only view)."""
    return _FAMILIES


def get_template_family(name: str) -> TemplateFamily:
    """Return the built-in family called ``name``; raise :class:`UserError` if unknown."""
    try:
        return _FAMILIES[name]
    except KeyError:
        known = ", ".join(sorted(_FAMILIES))
        raise UserError(f"unknown chat-template family {name!r}; known: {known}") from None


def detect_template_family(chat_template: str) -> TemplateFamily:
    """Guess the family from the template text, by the control tokens it writes.

    Detection is deliberately conservative: a template that matches no rule raises
    :class:`UserError` asking for an explicit ``family=`` instead of guessing, because a
    wrong guess would put the turn boundary in the wrong place.
    """
    if "<|start_header_id|>" in chat_template and "<|eot_id|>" in chat_template:
        return LLAMA3
    if "<|im_start|>" in chat_template and "<|im_end|>" in chat_template:
        if "<think>" in chat_template or "reasoning_content" in chat_template:
            return QWEN3
        if "<tool_call>" in chat_template:
            return QWEN25
    known = ", ".join(sorted(_FAMILIES))
    raise UserError(
        "cannot detect the chat-template family from the template text; "
        f"pass family= explicitly (one of: {known})"
    )
