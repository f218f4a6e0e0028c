r"""The ``smollm2`` family: toolrollout's tools template for SmolLM2 (ChatML).

SmolLM2-Instruct's own template has no tools section; the one shipped with the converted
model (``toolrollout/apps/demo_smollm/chat_template.jinja``) adds one of the project's own
wording: hermes JSON calls (read by the ``qwen25`` parser) and each result in a ``tool``
turn of its own. Boundary ``\n``; earlier turns re-render unchanged.
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
