r"""Llama 3.1 / 3.2: header tokens, JSON calls with ``parameters``, an ``ipython`` tool role.

The model stops at ``<|eot_id|>`` (``<|eom_id|>`` after a ``<|python_tag|>`` built-in tool
call); the template writes nothing after it, and the next turn starts directly with
``<|start_header_id|>``. Tool results are an ``ipython`` turn each, holding the result as a
JSON string. The official templates put the tool schemas into the first user turn and
raise "This model only supports single tool-calls at once!" on an assistant turn with two
calls, so a turn with more than one call is a counted parse error (nothing runs, the model
is told, the turn keeps its text). Llama 3.2's template writes ``Today Date:`` from the
``date_string`` template kwarg, else from today's date.

Documented rewrites: a ``<|eom_id|>`` turn end re-renders as ``<|eot_id|>``; a render on
another day writes another ``Today Date:``.
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
