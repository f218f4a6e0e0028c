r"""The built-in chat-template families and their registry.

A family (:class:`TemplateFamily`) is what a token-exact rollout must know beyond the
template text (docs/rollouts.md#model-families). The built-in ones are the private modules
of this package, one per model maker, with their rules in the module docstrings;
:func:`detect_template_family` picks the family whose format a template renders, most
specific first.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from ..._exceptions import FieldError, UserError
from . import _deepseek, _glm, _gpt_oss, _kimi, _llama, _mistral, _qwen, _smollm
from ._family import CallIdRequest, TemplateFamily, TemplateProbe

__all__ = [
    "CallIdRequest",
    "TemplateFamily",
    "TemplateProbe",
    "detect_template_family",
    "get_template_family",
    "template_families",
]

_FAMILIES: Mapping[str, TemplateFamily] = MappingProxyType(
    {
        family.name: family
        for module in (_qwen, _llama, _mistral, _deepseek, _kimi, _glm, _gpt_oss, _smollm)
        for family in module.FAMILIES
    }
)
_DETECTION_ORDER: tuple[TemplateFamily, ...] = tuple(
    sorted(
        (family for family in _FAMILIES.values() if family.detect is not None),
        key=lambda family: -family.detect_priority,
    )
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
        raise UserError(f"unknown model family {name!r}; known: {known}") from None


def detect_template_family(
    chat_template: str | TemplateProbe, *, source: str = "this chat template"
) -> TemplateFamily:
    """The family whose format a template (its text, or a :class:`TemplateProbe` of what it
    renders) shows, most specific first. A template that matches no rule raises
    :class:`UserError` naming the option to set: a wrong guess would put the turn boundary
    in the wrong place.
    """
    probe = (
        chat_template
        if isinstance(chat_template, TemplateProbe)
        else TemplateProbe(template=chat_template, rendered=None, error="not rendered")
    )
    for family in _DETECTION_ORDER:
        assert family.detect is not None
        if family.detect(probe):
            return family
    known = ", ".join(sorted(_FAMILIES))
    raise FieldError(
        f"cannot detect the model family of {source}; set {{config.family}} (family= in the "
        f"trainer adapters) to one of: {known}",
        "config.family",
    )
