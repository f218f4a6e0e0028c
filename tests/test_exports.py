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
    "toolrollout.apps.eval",
    "toolrollout.exceptions",
    "toolrollout.metrics",
    "toolrollout.interactions",
    "toolrollout.integrations",
    "toolrollout.rewards",
    "toolrollout.rollout",
    "toolrollout.spec",
    "toolrollout.tools",
    "toolrollout.testing",
    "toolrollout.apps.demo",
    "toolrollout.apps.demo_vl",
    "toolrollout.sandbox",
    "toolrollout.search",
    "toolrollout.tools.mcp",
    "toolrollout.apps.mcp_servers",
    "toolrollout.apps.bench",
    "toolrollout.apps.distributed",
    "toolrollout.apps.gateway",
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


# What a trainer imports must not pull the applications' dependencies.
HEAVY = ("torch", "transformers", "pyarrow", "fastapi", "uvicorn", "bm25s", "mcp", "numpy", "PIL")


def test_top_level_import_is_light() -> None:
    """`import toolrollout` (and the core subpackages) load none of the heavy dependencies."""
    code = (
        "import sys\n"
        f"heavy = {HEAVY!r}\n"
        "import toolrollout\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
        "import toolrollout.rollout, toolrollout.tools, toolrollout.engines, toolrollout.chat\n"
        "import toolrollout.rewards, toolrollout.exceptions\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["[]", "[]"], out.stdout


def test_output_names_load_on_first_access() -> None:
    """The parquet names are lazy: listed and importable, loading pyarrow only when used."""
    code = (
        "import sys, toolrollout\n"
        "from toolrollout import TrajectoryWriter, read_rows, write_trajectories\n"
        "from toolrollout.rollout import ShardWriter, read_leftover\n"
        "print('pyarrow' in sys.modules, TrajectoryWriter.__module__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "toolrollout.rollout._output"]


def test_top_level_is_what_a_trainer_uses() -> None:
    import toolrollout
    import toolrollout.exceptions

    names = set(toolrollout.__all__)
    assert len(names) <= 40
    # Exceptions live in toolrollout.exceptions; only the two a caller catches are at the top.
    assert names & set(toolrollout.exceptions.__all__) == {"ToolRolloutError", "UserError"}
    assert "calculator_tool" not in names  # a demo tool: toolrollout.tools.calculator_tool
    for core in ("RolloutRunner", "RolloutConfig", "Trajectory", "Engine", "function_tool"):
        assert core in names


def test_exceptions_module_is_the_whole_tree() -> None:
    from toolrollout import _exceptions, exceptions

    defined = {
        name
        for name, value in vars(_exceptions).items()
        if inspect.isclass(value) and issubclass(value, Exception)
    }
    assert set(exceptions.__all__) == defined
    for name in exceptions.__all__:
        assert issubclass(getattr(exceptions, name), exceptions.ToolRolloutError)


def test_exception_tree_separates_fault_owners() -> None:
    from toolrollout import exceptions as tr

    assert issubclass(tr.ConfigError, tr.UserError)
    assert issubclass(tr.OverlongPromptError, tr.EngineRequestRejected)
    assert issubclass(tr.EngineRequestRejected, tr.EngineError)
    assert issubclass(tr.ToolTimeout, tr.ToolError)
    assert issubclass(tr.ToolParseError, tr.ModelBehaviorError)
    for cls in (tr.UserError, tr.EngineError, tr.ToolError, tr.ModelBehaviorError):
        assert issubclass(cls, tr.ToolRolloutError)
    assert not issubclass(tr.EngineError, tr.UserError)
