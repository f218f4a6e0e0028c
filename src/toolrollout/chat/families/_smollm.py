r"""The ``smollm2`` family: toolrollout's tools template for SmolLM2 (ChatML).

SmolLM2-Instruct's own template is ChatML with a default system line and no tools section.
The template toolrollout ships with the converted model
(``toolrollout/apps/demo_smollm/chat_template.jinja``) keeps those turns and adds a tools
section of the project's own wording: the schemas one a line at the end of the system turn,
calls written as ``<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`` (hermes JSON,
read by the ``qwen25`` parser) and every result in a turn of its own,
``<|im_start|>tool\n…<|im_end|>``. The model stops at ``<|im_end|>``; the template writes
``\n`` after it (the boundary). Earlier turns re-render unchanged.

Detection is by the render: ChatML, a hermes call and a ``tool`` turn for the result, with
no ``<tool_response>`` wrapper (which is Qwen2.5's user-turn form) and no image tokens; from
the template text alone (not rendered), ChatML with ``<tool_call>`` and SmolLM's default
system line.
"""

from __future__ import annotations

from ._family import TemplateFamily, TemplateProbe

__all__ = ["FAMILIES", "SMOLLM2"]

_IM_END = "<|im_end|>"


def _detect_smollm2(probe: TemplateProbe) -> bool:
    if not probe.mentions("<|im_start|>", _IM_END):
        return False
    if probe.rendered is None:  # the template text alone: SmolLM2's default system line
        return probe.mentions("<tool_call>", "named SmolLM")
    return (
        probe.renders('<tool_call>\n{"name": "probe_tool"', "<|im_start|>tool\n")
        and not probe.renders("<tool_response>")
        and not probe.mentions("<|image_pad|>")
    )


SMOLLM2 = TemplateFamily(
    name="smollm2",
    stop_tokens=(_IM_END,),
    boundary="\n",
    generation_prompt="<|im_start|>assistant\n",
    tool_parser="qwen25",
    description="toolrollout's SmolLM2 ChatML tools template: schemas in the system turn, "
    "<tool_call> JSON, each result in its own tool turn.",
    detect=_detect_smollm2,
    detect_priority=5,
    arguments_as="object",
)

FAMILIES: tuple[TemplateFamily, ...] = (SMOLLM2,)
