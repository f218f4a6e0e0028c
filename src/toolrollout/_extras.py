"""Optional dependencies: which extra provides which module, and a one-line error when absent.

``pip install toolrollout`` is the library a trainer imports (HTTP client, chat, tools,
rollout loop). Applications (the embedded engine and server, the sandbox, the retriever, MCP,
parquet output, vision) need extras. Their entry points call :func:`require_extra` first, so a
missing extra is a :class:`~toolrollout.exceptions.MissingExtraError` naming the ``pip install``
that fixes it, not a traceback from deep inside an import. Keep :data:`EXTRAS` in step with
``[project.optional-dependencies]`` in ``pyproject.toml`` (a test checks it).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from toolrollout._exceptions import MissingExtraError

__all__ = ["EXTRAS", "extra_for_module", "require_extra"]

EXTRAS: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType(
    {
        "parquet": ("pyarrow",),
        "cli": ("typer", "rich", "transformers", "pyarrow"),
        "vision": ("PIL", "transformers"),
        "mcp": ("mcp", "httpx2", "jsonschema"),
        "sandbox": ("fastapi", "uvicorn"),
        "search": ("bm25s", "Stemmer", "numpy", "fastapi", "uvicorn"),
        "serve": ("torch", "transformers", "safetensors", "fastapi", "uvicorn"),
        "video": ("av", "PIL", "mcp"),
        "eval": ("numpy", "matplotlib", "transformers", "pyarrow"),
        "bench": ("torch", "transformers", "fastapi", "uvicorn"),
    }
)
"""Extra name -> the top-level modules it installs that toolrollout imports (smallest first)."""


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that fails, or a broken __spec__
        return False


def require_extra(extra: str, feature: str, *modules: str) -> None:
    """Raise :class:`MissingExtraError` unless the modules of ``extra`` can be imported.

    ``feature`` names what needs it (``"toolrollout serve"``, ``"the embedded engine"``);
    ``modules`` narrows the check to the ones it imports (default: all of the extra's).
    Nothing is imported: the modules are only looked up.
    """
    for module in modules or EXTRAS[extra]:
        if not _installed(module):
            raise MissingExtraError(
                f"{feature} needs the {extra!r} extra ({module} is not installed): "
                f"pip install 'toolrollout[{extra}]'",
                extra=extra,
                module=module,
            )


def extra_for_module(module: str) -> str | None:
    """The smallest extra that installs ``module`` (the first in :data:`EXTRAS`).

    ``None`` when no extra provides it (then it is not an optional dependency of toolrollout).
    """
    top = module.partition(".")[0]
    return next((extra for extra, modules in EXTRAS.items() if top in modules), None)
