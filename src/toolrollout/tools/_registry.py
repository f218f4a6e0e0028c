"""Tool types by name: what a tool-config entry's ``config.type`` builds.

Builders may be ``"module:attribute"`` strings imported on first use, so this package
imports none of the backends (the sandbox, the search client, the MCP SDK).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Protocol

from toolrollout._exceptions import ConfigError, UserError

from ._base import Tool
from ._models import ToolEntryModel

__all__ = ["BuildContext", "ToolBuilder", "register_tool_type", "tool_type_builder", "tool_types"]


@dataclass(frozen=True, slots=True)
class BuildContext:
    """Where the entry being built comes from, handed to every builder."""

    source: str
    """The config as named in messages: its path, or a label such as ``<tool config>``."""
    base_dir: Path
    """Folder that relative paths inside entries are resolved against (the YAML's folder)."""
    index: int = 0
    """Position of the entry in the config's ``tools`` list."""

    def where(self, key: str) -> str:
        """``<source>: tools[<index>].<key>``, the prefix of an error message about ``key``."""
        return f"{self.source}: tools[{self.index}].{key}"

    def resolve(self, path: str | PathLike[str]) -> Path:
        """``path`` with ``~`` expanded, relative to :attr:`base_dir` unless absolute."""
        resolved = Path(path).expanduser()
        return resolved if resolved.is_absolute() else self.base_dir / resolved


class ToolBuilder(Protocol):
    """Builds the tools of one entry (an MCP entry yields one tool per server tool)."""

    def __call__(self, entry: ToolEntryModel, context: BuildContext) -> Sequence[Tool]: ...


_BUILTIN_TYPES: Mapping[str, str] = {
    "native": "toolrollout.tools._config:build_native_entry",
    "mcp": "toolrollout.tools.mcp._config:build_mcp_entry",
    "sandbox": "toolrollout.sandbox._tool:build_sandbox_entry",
    "search": "toolrollout.search._client:build_search_entry",
}
"""The shipped types; each string is imported on first use."""

_types: dict[str, ToolBuilder | str] = dict(_BUILTIN_TYPES)


def register_tool_type(name: str, builder: ToolBuilder | str, *, replace: bool = False) -> None:
    """Make ``config.type: <name>`` build its entries with ``builder`` (a callable
    ``(entry, context) -> [Tool, ...]`` or a ``"module:attribute"`` string naming one)."""
    if not name or not name.replace("_", "").replace("-", "").isalnum():
        raise UserError(f"tool type {name!r} is invalid: use letters, digits, '_' or '-'")
    if isinstance(builder, str):
        _split(builder)
    elif not callable(builder):
        raise UserError(f"the builder of tool type {name!r} must be callable or 'module:attr'")
    if name in _types and not replace:
        raise UserError(f"tool type {name!r} is already registered (pass replace=True)")
    _types[name] = builder


def tool_types() -> tuple[str, ...]:
    """The registered type names, built-in ones first."""
    return tuple(_types)


def tool_type_builder(name: str) -> ToolBuilder:
    """The builder of ``name``, imported now if registered by its name (else ConfigError)."""
    try:
        builder = _types[name]
    except KeyError:
        raise ConfigError(
            f"unknown tool type {name!r} (registered: {', '.join(tool_types())})"
        ) from None
    if isinstance(builder, str):
        module_name, attr_path = _split(builder)
        try:
            obj = import_attribute(module_name, attr_path)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(
                f"tool type {name!r}: cannot import its builder {builder!r}: {exc}"
            ) from exc
        if not callable(obj):
            raise ConfigError(f"tool type {name!r}: {builder!r} is not callable")
        resolved: ToolBuilder = obj
        _types[name] = resolved
        return resolved
    return builder


def import_attribute(module_name: str, attr_path: str) -> object:
    """``attr_path`` (dotted) of the module ``module_name``, imported."""
    obj: object = importlib.import_module(module_name)
    for attr in attr_path.split("."):
        obj = getattr(obj, attr)
    return obj


def _split(target: str) -> tuple[str, str]:
    module_name, _, attr_path = target.partition(":")
    if not module_name or not attr_path:
        raise UserError(f"{target!r} is not of the form 'package.module:attribute'")
    return module_name, attr_path
