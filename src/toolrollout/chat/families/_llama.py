r"""Llama 3.1 / 3.2: header tokens, JSON calls with ``parameters``, an ``ipython`` tool role.

The model stops at ``<|eot_id|>`` (``<|eom_id|>`` after a ``<|python_tag|>`` call); the
template writes nothing after it. The official templates raise on an assistant turn with
two calls, so a turn with more than one is a counted parse error.

Documented rewrites: ``<|eom_id|>`` re-renders as ``<|eot_id|>``; a render on another day
writes another ``Today Date:`` (Llama 3.2, without the ``date_string`` kwarg).
"""

from __future__ import annotations

import re

from ._family import TemplateFamily, TemplateProbe

__all__ = ["FAMILIES", "LLAMA3"]

_TODAY = re.compile(r"Today Date: \d{1,2} [A-Z][a-z]{2} \d{4}\n")


def _llama_rewrites(text: str) -> str:
    """Llama templates re-render ``<|eom_id|>`` as ``<|eot_id|>``; the date may change."""
    return _TODAY.sub("Today Date: (today)\n", text.replace("<|eom_id|>", "<|eot_id|>"))


def _is_llama3(probe: TemplateProbe) -> bool:
    if probe.rendered is None:
        return probe.mentions("<|start_header_id|>", "<|eot_id|>")
    return probe.renders("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")


LLAMA3 = TemplateFamily(
    name="llama3",
    stop_tokens=("<|eot_id|>", "<|eom_id|>"),
    boundary="",
    generation_prompt="<|start_header_id|>assistant<|end_header_id|>\n\n",
    tool_parser="llama3",
    history_normalizer=_llama_rewrites,
    description="Llama 3.1/3.2: header tokens, JSON calls with 'parameters', ipython tool "
    "role, one call per turn.",
    detect=_is_llama3,
    max_calls_per_turn=1,
    parallel_calls=False,
)

FAMILIES: tuple[TemplateFamily, ...] = (LLAMA3,)
