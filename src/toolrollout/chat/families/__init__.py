"""The built-in model families, one module per model maker.

Each module defines ``FAMILIES``, a tuple of :class:`~toolrollout.chat.TemplateFamily`;
:func:`builtin_families` gathers them in the order of :data:`_FAMILY_MODULES`. The registry
(:mod:`toolrollout.chat._families`) detects and looks families up from this list.
"""

from __future__ import annotations

from types import ModuleType

from .._family import TemplateFamily
from . import _deepseek, _glm, _gpt_oss, _kimi, _llama, _mistral, _qwen

__all__ = ["builtin_families"]

_FAMILY_MODULES: tuple[ModuleType, ...] = (
    _qwen,
    _llama,
    _mistral,
    _deepseek,
    _kimi,
    _glm,
    _gpt_oss,
)


def builtin_families() -> tuple[TemplateFamily, ...]:
    """Every built-in family, module by module."""
    return tuple(family for module in _FAMILY_MODULES for family in module.FAMILIES)
