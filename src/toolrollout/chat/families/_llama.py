"""Llama 3.1 / 3.2: header tokens, JSON calls with ``parameters``, an ``ipython`` tool role.

The model stops at ``<|eot_id|>`` (``<|eom_id|>`` after a ``<|python_tag|>`` built-in tool
call); the template writes nothing after it, and the next turn starts directly with
``<|start_header_id|>``. Tool results are an ``ipython`` turn each. The Llama templates
re-render a ``<|eom_id|>`` turn end as ``<|eot_id|>`` (a documented rewrite).
"""

from __future__ import annotations

from .._family import TemplateFamily, TemplateProbe

__all__ = ["FAMILIES", "LLAMA3"]


def _eom_as_eot(text: str) -> str:
    """Llama templates re-render a ``<|eom_id|>`` turn end as ``<|eot_id|>`` for JSON tools."""
    return text.replace("<|eom_id|>", "<|eot_id|>")


def _is_llama3(probe: TemplateProbe) -> bool:
    return probe.mentions("<|start_header_id|>", "<|eot_id|>")


LLAMA3 = TemplateFamily(
    name="llama3",
    stop_tokens=("<|eot_id|>", "<|eom_id|>"),
    boundary="",
    generation_prompt="<|start_header_id|>assistant<|end_header_id|>\n\n",
    tool_parser="llama3",
    history_normalizer=_eom_as_eot,
    description="Llama 3.1/3.2: header tokens, JSON calls with 'parameters', ipython tool role.",
    detect=_is_llama3,
)

FAMILIES: tuple[TemplateFamily, ...] = (LLAMA3,)
