"""The public surface is deliberate: every public module has a sorted, complete __all__."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys

import pytest

PUBLIC_MODULES = [
    "toolrollout",
    "toolrollout.chat",
    "toolrollout.data",
    "toolrollout.engines",
    "toolrollout.eval",
    "toolrollout.metrics",
    "toolrollout.interactions",
    "toolrollout.integrations",
    "toolrollout.rewards",
    "toolrollout.rollout",
    "toolrollout.spec",
    "toolrollout.tools",
    "toolrollout.testing",
    "toolrollout.demo",
    "toolrollout.demo_vl",
    "toolrollout.sandbox",
    "toolrollout.search",
    "toolrollout.tools.mcp",
    "toolrollout.mcp_servers",
    "toolrollout.bench",
    "toolrollout.distributed",
]


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_all_is_sorted_and_resolves(name: str) -> None:
    module = importlib.import_module(name)
    exported = list(module.__all__)
    assert len(exported) == len(set(exported)), "duplicates in __all__"
    lazy = getattr(module, "_LAZY", {})  # loaded on access; they import a trainer package
    for attr in exported:
        if attr in lazy:
            continue
        assert hasattr(module, attr), f"{name}.__all__ names missing {attr!r}"

    # ruff's RUF022 (isort-style) order: CONSTANTS, Classes, then everything else
    def key(n: str) -> tuple[int, str]:
        if n.isupper():
            return (0, n)
        return (1, n) if n[0].isupper() else (2, n)

    assert exported == sorted(exported, key=key), f"{name}.__all__ is not sorted"


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_every_public_class_and_function_is_exported(name: str) -> None:
    module = importlib.import_module(name)
    for attr, value in vars(module).items():
        if attr.startswith("_") or inspect.ismodule(value):
            continue
        if (inspect.isclass(value) or inspect.isfunction(value)) and getattr(
            value, "__module__", ""
        ).startswith(name):
            assert attr in module.__all__, f"{name}.{attr} is public but not in __all__"


def test_top_level_import_is_light() -> None:
    """`import toolrollout` must not pull torch or transformers (trainers import it)."""
    code = "import sys, toolrollout; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_exception_tree_separates_fault_owners() -> None:
    import toolrollout as tr

    assert issubclass(tr.ConfigError, tr.UserError)
    assert issubclass(tr.OverlongPromptError, tr.EngineRequestRejected)
    assert issubclass(tr.EngineRequestRejected, tr.EngineError)
    assert issubclass(tr.ToolTimeout, tr.ToolError)
    assert issubclass(tr.ToolParseError, tr.ModelBehaviorError)
    for cls in (tr.UserError, tr.EngineError, tr.ToolError, tr.ModelBehaviorError):
        assert issubclass(cls, tr.ToolRolloutError)
    assert not issubclass(tr.EngineError, tr.UserError)
