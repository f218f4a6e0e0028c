"""Tool-config files in verl's layout: ``tools: [{class_name, config, tool_schema}]``.

Every problem is a :class:`~toolrollout.exceptions.ConfigError` naming the file and key path
(``tools/x.yaml: tools[0].config.timeout: must be a positive number``).
"""

from __future__ import annotations

from collections.abc import Mapping
from os import PathLike
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from toolrollout._exceptions import ConfigError, UserError

from ._base import Tool
from ._function import FunctionTool
from ._models import ToolConfigFileModel, ToolEntryConfigModel, ToolEntryModel, key_path
from ._registry import BuildContext, ToolBuilder, import_attribute, tool_type_builder, tool_types
from ._verl import VerlToolAdapter, is_verl_tool_class

__all__ = [
    "VERL_EQUIVALENTS",
    "build_native_entry",
    "load_tool_config",
    "native_entry_builder",
    "own_config",
    "tools_from_config",
]

M = TypeVar("M", bound=BaseModel)

VERL_EQUIVALENTS: Mapping[str, str] = {
    "verl.tools.gsm8k_tool.Gsm8kTool": "toolrollout.tools.Gsm8kTool",
    "verl.tools.sandbox_fusion_tools.SandboxFusionTool": "toolrollout.sandbox.SandboxTool",
    "verl.tools.search_tool.SearchTool": "toolrollout.search.VerlSearchTool",
}
"""verl class names that load as a toolrollout tool, so verl's example configs run as they
are (without verl installed)."""

_VERL_LATER: Mapping[str, str] = {
    "verl.tools.mcp_search_tool.MCPSearchTool": "mcp",
    "verl.tools.mcp_base_tool.MCPBaseTool": "mcp",
}
"""verl classes that load through another tool type (their entries must say so)."""

_MESSAGES: Mapping[str, str] = {
    "missing": "is required",
    "extra_forbidden": "unknown key",
    "float_parsing": "must be a number",
    "float_type": "must be a number",
    "int_parsing": "must be an integer",
    "int_type": "must be an integer",
    "int_from_float": "must be an integer",
    "string_type": "must be a string",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
    "model_attributes_type": "must be a mapping",
    "list_type": "must be a list",
    "string_too_short": "must not be empty",
    "string_pattern_mismatch": "must be 1-64 letters, digits, '_' or '-'",
}


def _message(error: Mapping[str, Any]) -> str:
    kind = str(error.get("type", ""))
    ctx = error.get("ctx") or {}
    if kind == "greater_than" and ctx.get("gt") == 0:
        text = "must be a positive number"
    elif kind == "greater_than_equal" and ctx.get("ge") == 0:
        text = "must be a number >= 0"
    elif kind == "literal_error":
        text = f"must be one of {ctx.get('expected', '?')}"
    else:
        text = _MESSAGES.get(kind, str(error.get("msg", "is invalid")))
    if kind not in ("missing", "extra_forbidden"):
        value = repr(error.get("input"))
        text += f" (got {value if len(value) <= 60 else value[:57] + '...'})"
    return text


def _validation_error(source: str, exc: ValidationError, prefix: str = "") -> ConfigError:
    lines = [
        f"{source}: {prefix}{key_path(e['loc']) or '<root>'}: {_message(e)}" for e in exc.errors()
    ]
    return ConfigError("\n".join(lines))


def _import(name: str) -> object:
    """Import ``pkg.mod.Attr`` or ``pkg.mod:attr.path``."""
    if ":" in name:
        module_name, _, attr_path = name.partition(":")
    else:
        module_name, _, attr_path = name.rpartition(".")
    if not module_name or not attr_path:
        raise ImportError(f"{name!r} is not of the form 'package.module.Name' or 'module:function'")
    return import_attribute(module_name, attr_path)


def import_entry(
    name: str, where: str, verl_maps: Mapping[str, str] | None = None
) -> tuple[str, object]:
    """The name imported and the object a config names (after ``verl_maps``, the verl names
    toolrollout maps); a :class:`ConfigError` at ``where`` when it cannot be imported."""
    verl_maps = verl_maps or {}
    target = verl_maps.get(name, name)
    try:
        return target, _import(target)
    except (ImportError, AttributeError) as exc:
        hint = ""
        if name.startswith("verl.") and verl_maps:
            hint = "; verl classes need verl installed, except those toolrollout maps: " + (
                ", ".join(sorted(verl_maps))
            )
        raise ConfigError(f"{where}: cannot import {target!r}: {exc}{hint}") from exc


def with_entry_limits(entry: ToolEntryModel, tools: list[Tool], where: str) -> list[Tool]:
    """``tools`` with the entry's limit keys applied over their own limits."""
    try:
        return [tool.with_limits(entry.config.to_limits(tool.limits)) for tool in tools]
    except UserError as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def build_native_entry(entry: ToolEntryModel, context: BuildContext) -> list[Tool]:
    """Build a ``type: native`` entry: resolve ``class_name`` to a tool."""
    where = context.where
    class_name = entry.class_name.strip()
    config = entry.config.model_dump(exclude_none=True)
    schema = None if entry.tool_schema is None else entry.tool_schema.model_dump(exclude_none=True)
    if class_name in _VERL_LATER:
        later = _VERL_LATER[class_name]
        if later in tool_types():
            raise ConfigError(
                f"{where('class_name')}: {class_name} maps to toolrollout's '{later}' tools: "
                f"set config.type: {later}"
            )
        raise ConfigError(
            f"{where('class_name')}: {class_name} maps to toolrollout's "
            f"'{later}' tools, which are not available yet"
        )
    target, obj = import_entry(class_name, where("class_name"), VERL_EQUIVALENTS)
    tool: Tool
    try:
        if isinstance(obj, type) and issubclass(obj, Tool):
            tool = obj.from_config(config, schema)
        elif isinstance(obj, Tool):
            tool = obj
        elif is_verl_tool_class(obj):
            tool = VerlToolAdapter.build(obj, config, schema)  # type: ignore[arg-type]
            schema = None  # the verl tool was built with it already
        elif callable(obj) and not isinstance(obj, type):
            tool = FunctionTool.from_function(obj)
        else:
            raise ConfigError(
                f"{where('class_name')}: {target!r} is neither a Tool subclass, a tool, a "
                "verl-style tool class nor a function"
            )
    except UserError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"{where('class_name')}: {exc}") from exc
    except Exception as exc:  # the tool's own constructor failed: report where
        raise ConfigError(
            f"{where('class_name')}: building {target!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    if schema is not None:
        try:
            tool = tool.with_schema(schema)
        except UserError as exc:
            raise ConfigError(f"{where('tool_schema')}: {exc}") from exc
    return with_entry_limits(entry, [tool], where("config"))


def native_entry_builder(kind: str, cls: type[Tool], needs: str) -> ToolBuilder:
    """The builder of ``type: <kind>`` entries: :func:`build_native_entry`, whose
    ``class_name`` must make ``cls`` tools (``needs`` names the classes that do)."""

    def build(entry: ToolEntryModel, context: BuildContext) -> list[Tool]:
        tools = build_native_entry(entry, context)
        for tool in tools:
            if not isinstance(tool, cls):
                raise ConfigError(
                    f"{context.where('class_name')}: type {kind!r} needs {needs}, "
                    f"got {entry.class_name!r}"
                )
        return tools

    return build


_LOADER_KEYS = frozenset(ToolEntryConfigModel.model_fields) | {"enable_global_rate_limit"}
"""Keys of an entry's ``config`` that are not the tool's: the loader's (type and limits),
and verl's ``enable_global_rate_limit`` (its Ray-actor rate limiter: no meaning here)."""


def own_config(model: type[M], config: Mapping[str, Any]) -> M:
    """A tool's own keys of an entry's ``config``, validated by ``model``; problems raise
    a UserError naming each key (``config.topk: unknown key``)."""
    try:
        return model.model_validate({k: v for k, v in config.items() if k not in _LOADER_KEYS})
    except ValidationError as exc:
        problems = "; ".join(
            f"config.{'.'.join(str(p) for p in e['loc'])}: "
            + {"extra_forbidden": "unknown key", "missing": "is required"}.get(e["type"], e["msg"])
            for e in exc.errors()
        )
        raise UserError(problems) from exc


def tools_from_config(
    data: object,
    *,
    source: str = "<tool config>",
    base_dir: str | PathLike[str] | None = None,
) -> list[Tool]:
    """Build the tools of an already-parsed config (``{"tools": [...]}``); ``source`` names
    it in messages, ``base_dir`` resolves relative paths (default: the current directory)."""
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{source}: expected a mapping with a 'tools' list, got {type(data).__name__}"
        )
    try:
        parsed = ToolConfigFileModel.model_validate(data, context={"tool_types": tool_types()})
    except ValidationError as exc:
        raise _validation_error(source, exc) from exc
    folder = Path.cwd() if base_dir is None else Path(base_dir)
    tools: list[Tool] = []
    seen: dict[str, int] = {}
    for index, entry in enumerate(parsed.tools):
        context = BuildContext(source, folder, index)
        try:
            builder = tool_type_builder(entry.config.type)
        except ConfigError as exc:
            raise ConfigError(f"{context.where('config.type')}: {exc}") from exc
        built = builder(entry, context)
        for tool in built:
            if tool.name in seen:
                raise ConfigError(
                    f"{source}: tools[{index}]: duplicate tool name {tool.name!r} "
                    f"(also defined by tools[{seen[tool.name]}])"
                )
            seen[tool.name] = index
            tools.append(tool)
    return tools


def load_tool_config(path: str | PathLike[str]) -> list[Tool]:
    """Load the tools of a verl-layout YAML tool config.

    ``class_name`` may be a verl class toolrollout maps (``VERL_EQUIVALENTS``), a
    :class:`Tool` subclass, a verl ``BaseTool`` subclass (needs verl), or
    ``module:function``; ``config`` carries ``type`` and the limit keys; ``tool_schema``
    replaces the schema shown to the model.
    """
    source = str(path)
    data = read_yaml_file(path)
    return tools_from_config(data, source=source, base_dir=Path(path).resolve().parent)


def read_config_file(path: str | PathLike[str]) -> str:
    """The text of a UTF-8 config file; a :class:`ConfigError` naming it when unreadable."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the file: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (bad byte at offset {exc.start})") from exc


def read_yaml_file(path: str | PathLike[str]) -> Any:
    """A YAML config file, loaded; a :class:`ConfigError` with the line when it is invalid."""
    text = read_config_file(path)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}: invalid YAML{where}: {problem}") from exc
