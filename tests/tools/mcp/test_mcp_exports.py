"""The MCP packages' public surface: sorted, complete ``__all__`` (as tests/test_exports.py)."""

from __future__ import annotations

import importlib
import inspect

import pytest

MODULES = ["toolrollout.tools.mcp", "toolrollout.mcp_servers"]


@pytest.mark.parametrize("name", MODULES)
def test_all_is_sorted_complete_and_resolves(name: str) -> None:
    module = importlib.import_module(name)
    exported = list(module.__all__)
    assert len(exported) == len(set(exported))
    for attr in exported:
        assert hasattr(module, attr), f"{name}.__all__ names missing {attr!r}"

    def key(n: str) -> tuple[int, str]:
        if n.isupper():
            return (0, n)
        return (1, n) if n[0].isupper() else (2, n)

    assert exported == sorted(exported, key=key), f"{name}.__all__ is not sorted"
    for attr, value in vars(module).items():
        if attr.startswith("_") or inspect.ismodule(value):
            continue
        if (inspect.isclass(value) or inspect.isfunction(value)) and getattr(
            value, "__module__", ""
        ).startswith(name):
            assert attr in module.__all__, f"{name}.{attr} is public but not in __all__"


def test_importing_toolrollout_tools_does_not_import_the_mcp_sdk() -> None:
    import subprocess
    import sys

    code = "import sys, toolrollout.tools; print('mcp' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
