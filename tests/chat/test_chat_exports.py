"""The public surface of toolrollout.chat is deliberate: sorted, complete, importable."""

from __future__ import annotations

import inspect
from types import ModuleType

import pytest

import toolrollout.chat
import toolrollout.chat.parsers


@pytest.mark.parametrize("module", [toolrollout.chat, toolrollout.chat.parsers])
def test_all_is_sorted_and_resolvable(module: ModuleType) -> None:
    names = module.__all__
    assert names == sorted(names)
    assert len(set(names)) == len(names)
    for name in names:
        assert hasattr(module, name), name


@pytest.mark.parametrize("module", [toolrollout.chat, toolrollout.chat.parsers])
def test_every_public_class_and_function_is_exported(module: ModuleType) -> None:
    public = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and (inspect.isclass(value) or inspect.isfunction(value))
    }
    assert public <= set(module.__all__)


def test_exported_objects_have_docstrings() -> None:
    for name in toolrollout.chat.__all__:
        value = getattr(toolrollout.chat, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert inspect.getdoc(value), name
