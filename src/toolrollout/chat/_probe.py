"""What a chat template renders for the probe conversation: the evidence a model family
is detected from (:class:`TemplateProbe`), and the form (mapping or JSON string) in which
the template wants a call's arguments.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from .families import TemplateFamily
from .families._family import PROBE_MESSAGES, PROBE_TOOLS, TemplateProbe

__all__ = ["probe_template", "with_rendered_arguments"]


def _render(
    tokenizer: Any,
    template: str,
    template_kwargs: Mapping[str, Any],
    messages: Sequence[Mapping[str, Any]],
) -> Any:
    """``messages`` (the probe's, or a variant) rendered with the probe's tools."""
    return tokenizer.apply_chat_template(
        [dict(message) for message in messages],
        tools=[dict(tool) for tool in PROBE_TOOLS],
        chat_template=template,
        add_generation_prompt=True,
        tokenize=False,
        **template_kwargs,
    )


def probe_template(
    tokenizer: Any, template: str, template_kwargs: Mapping[str, Any]
) -> TemplateProbe:
    """What ``template`` renders for the detection probe."""
    try:
        rendered = _render(tokenizer, template, template_kwargs, PROBE_MESSAGES)
    except Exception as exc:  # any failure only means the probe says nothing
        return TemplateProbe(template, None, f"{type(exc).__name__}: {exc}")
    if not isinstance(rendered, str):
        return TemplateProbe(template, None, "the template rendered no text")
    return TemplateProbe(template, rendered)


def with_rendered_arguments(
    family: TemplateFamily, tokenizer: Any, template: str, template_kwargs: Mapping[str, Any]
) -> TemplateFamily:
    """``family`` with :attr:`~TemplateFamily.arguments_as` set to what ``template``
    renders right: one probe call is rendered with its arguments as a mapping and as a
    JSON string, and the family's own form is kept unless only the other one renders the
    call's JSON once (Kimi-K2-Instruct's first template applies ``tojson`` to a string
    too, where K2-Thinking's prints it as given: one family, two templates)."""

    def renders_once(form: Literal["object", "json"]) -> bool:
        # Without error, and without the arguments encoded twice (\"x\") or as a
        # Python dict ('x').
        arguments = {"x": "1"}
        value: Any = json.dumps(arguments) if form == "json" else dict(arguments)
        messages = [dict(message) for message in PROBE_MESSAGES]
        call = dict(messages[2]["tool_calls"][0])
        call["function"] = {**call["function"], "arguments": value}
        messages[2] = {**messages[2], "tool_calls": [call]}
        try:
            rendered = _render(tokenizer, template, template_kwargs, messages)
        except Exception:  # a template that cannot read this form
            return False
        return isinstance(rendered, str) and '\\"x\\"' not in rendered and "'x'" not in rendered

    own = family.arguments_as
    other: Literal["object", "json"] = "json" if own == "object" else "object"
    if renders_once(own) or not renders_once(other):
        return family
    return dataclasses.replace(family, arguments_as=other)
