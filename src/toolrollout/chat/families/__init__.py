r"""Chat-template families and their turn-boundary rules.

A rollout keeps one token transcript per trajectory. The prompt is rendered once; every
model turn is appended **verbatim** from the engine's output ids; every tool turn is
appended as the token **delta** that the chat template adds for the new messages plus the
next generation prompt. The delta must also carry the *boundary*: text that the template
writes after the model's stop token but that the model itself never emits (it stops *at*
the stop token). Forgetting it is the classic multi-turn bug (verl #3720, verl PR #6921):
the trained sequence then differs from what a fresh render would give the model.

The registry
------------

Each family (:class:`TemplateFamily`, defined in :mod:`toolrollout.chat.families._family`) states
its stop tokens, its boundary, its parser and its documented rewrites; the built-in ones
are the private modules of this package, one per model maker, with their rules in
the module docstrings. :func:`detect_template_family` picks the family whose format a
template renders (most specific first); :func:`get_template_family` looks one up by the
name ``--family`` takes.

The boundary tokens belong to the **tool delta**, with loss mask 0: the model never
sampled them, so it must not be trained on them, yet the next turn must see them because
a fresh render of the conversation contains them. Some templates write the model's stop
token themselves as the start of the next turn (GLM-4.5's ``<|observation|>``); for them
the delta starts right after it (:attr:`TemplateFamily.stop_opens_next_turn`).

History rewrites
----------------

Some templates re-render earlier turns differently (Qwen3 drops the ``<think>`` block of
assistant turns before the last real user query; Llama re-renders ``<|eom_id|>`` as
``<|eot_id|>``). A fresh render is then not a prefix of a later render, which is why the
transcript is kept in tokens and never re-rendered. The family's ``history_normalizer``
states the rewrite, and :func:`~toolrollout.chat.check_drift` reports it as
``history_rewrite``, an expected kind that is not counted as a mismatch.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType, ModuleType

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

_FAMILY_MODULES: tuple[ModuleType, ...] = (
    _qwen,
    _llama,
    _mistral,
    _deepseek,
    _kimi,
    _glm,
    _gpt_oss,
    _smollm,
)


_FAMILIES: Mapping[str, TemplateFamily] = MappingProxyType(
    {family.name: family for module in _FAMILY_MODULES for family in module.FAMILIES}
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
    """The family whose format a template renders, most specific first.

    ``chat_template`` is the template text or a :class:`TemplateProbe` holding what it
    rendered for the probe conversation (:meth:`ChatFormat <toolrollout.chat.ChatFormat>`
    builds one). Detection is conservative: a template that matches no rule raises
    :class:`UserError` naming the option to set, because a wrong guess would put the turn
    boundary in the wrong place.
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
