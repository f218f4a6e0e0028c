"""Plain Python functions as tools: a pydantic model built from the signature gives the
JSON schema and validates the arguments; descriptions come from the docstring."""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, ParamSpec, Self, TypeVar, overload

import anyio.to_thread
import pydantic_core
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from toolrollout._exceptions import ToolArgumentError, ToolExecutionError, UserError

from ._base import Tool, normalize_function_schema
from ._docstrings import parse_docstring
from ._models import key_path
from ._types import ToolContext, ToolLimits, ToolResult

__all__ = ["FunctionTool", "function_tool", "to_tool_result"]

P = ParamSpec("P")
R = TypeVar("R")

_KEEP_VALUE_KEYS = frozenset({"default", "enum", "const", "examples"})
_SCHEMA_MAP_KEYS = frozenset({"properties", "$defs", "definitions", "patternProperties"})


@dataclass(frozen=True, slots=True)
class _Binding:
    """How one validated field (or the context) is passed back to the function."""

    param: str
    positional: bool
    key: str | None
    """Field name in the arguments model; None for the injected :class:`ToolContext`."""


def _strip_titles(node: Any) -> Any:
    """Drop pydantic's auto-generated ``title`` keys: noise in the prompt, no meaning."""
    if isinstance(node, list):
        return [_strip_titles(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in _SCHEMA_MAP_KEYS and isinstance(value, dict):
            out[key] = {name: _strip_titles(sub) for name, sub in value.items()}
        elif key in _KEEP_VALUE_KEYS:
            out[key] = value
        else:
            out[key] = _strip_titles(value)
    return out


def _callable_name(fn: Callable[..., Any]) -> str:
    target = fn.func if isinstance(fn, functools.partial) else fn
    return str(getattr(target, "__name__", type(target).__name__))


def _is_async(fn: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - callable objects with async __call__
    return call is not None and inspect.iscoroutinefunction(call)


def _describe_error(error: Mapping[str, Any]) -> str:
    """One validation error as ``'path': what is wrong (got value)``."""
    path = key_path(error.get("loc", ()))
    kind = error.get("type")
    if kind == "missing":
        return f"{path!r}: missing required argument"
    if kind == "extra_forbidden":
        return f"{path!r}: unexpected argument"
    value = repr(error.get("input"))
    if len(value) > 60:
        value = value[:57] + "..."
    return f"{path!r}: {error.get('msg', 'invalid value')} (got {value})"


def to_tool_result(value: Any) -> ToolResult:
    """Normalize a tool function's return value: str as is, ToolResult kept, others JSON."""
    if isinstance(value, ToolResult):
        return value
    if isinstance(value, str):
        return ToolResult(text=value)
    try:
        text = pydantic_core.to_json(value).decode()
    except pydantic_core.PydanticSerializationError as exc:
        raise ToolExecutionError(
            f"the tool returned a {type(value).__name__}, which cannot be JSON-encoded"
        ) from exc
    structured = None
    if isinstance(value, Mapping):
        structured = json.loads(text)
    return ToolResult(text=text, structured=structured)


@dataclass(frozen=True, kw_only=True)
class FunctionTool(Tool, Generic[P, R]):
    """A tool backed by a Python function (sync ones run in a worker thread); calling the
    tool object calls the function."""

    fn: Callable[P, R] = field(repr=False)
    """The wrapped function."""
    args_model: type[BaseModel] = field(repr=False, compare=False)
    """Pydantic model of the arguments, built from the signature; validates each call."""
    bindings: tuple[_Binding, ...] = field(default=(), repr=False, compare=False)
    """Maps validated fields back to the function's parameters."""
    accepts_extra: bool = field(default=False, repr=False, compare=False)
    """The function takes ``**kwargs``, so unknown arguments are passed through."""

    @classmethod
    def from_function(
        cls,
        fn: Callable[P, R],
        *,
        name: str | None = None,
        description: str | None = None,
        limits: ToolLimits | None = None,
    ) -> Self:
        """Wrap ``fn``: schema from its type hints, descriptions from its docstring; a
        :class:`ToolContext` parameter is injected and hidden from the model."""
        tool_name = name or _callable_name(fn)
        try:
            signature = inspect.signature(fn, eval_str=True)
        except (NameError, TypeError, ValueError, SyntaxError) as exc:
            raise UserError(f"cannot read the signature of tool {tool_name!r}: {exc}") from exc
        doc = parse_docstring(inspect.getdoc(fn))
        fields: dict[str, Any] = {}
        bindings: list[_Binding] = []
        accepts_extra = False
        for index, (pname, param) in enumerate(signature.parameters.items()):
            positional = param.kind is inspect.Parameter.POSITIONAL_ONLY
            if param.kind is inspect.Parameter.VAR_POSITIONAL:
                raise UserError(f"tool {tool_name!r}: *{pname} cannot be passed as JSON")
            if param.kind is inspect.Parameter.VAR_KEYWORD:
                accepts_extra = True
                continue
            annotation = param.annotation
            if annotation is ToolContext:
                bindings.append(_Binding(pname, positional, None))
                continue
            if annotation is inspect.Parameter.empty:
                annotation = Any
            # Field names are positional ("a0", "a1", ...) and the real name is the alias,
            # so parameters such as "json" or "_x" cannot clash with BaseModel attributes.
            key = f"a{index}"
            options: dict[str, Any] = {"alias": pname}
            if doc.params.get(pname):
                options["description"] = doc.params[pname]
            if param.default is not inspect.Parameter.empty:
                options["default"] = param.default
            fields[key] = (annotation, Field(**options))
            bindings.append(_Binding(pname, positional, key))
        config = ConfigDict(extra="allow" if accepts_extra else "forbid")
        try:
            model = create_model(tool_name, __config__=config, **fields)
            raw_schema = model.model_json_schema(by_alias=True)
        except Exception as exc:  # pydantic raises several types for unsupported hints
            raise UserError(
                f"cannot derive a JSON schema for tool {tool_name!r}: {type(exc).__name__}: {exc}"
            ) from exc
        schema = _strip_titles(raw_schema)
        parameters: dict[str, Any] = {"type": "object", "properties": schema.get("properties", {})}
        if schema.get("required"):
            parameters["required"] = schema["required"]
        if "$defs" in schema:
            parameters["$defs"] = schema["$defs"]
        return cls(
            name=tool_name,
            description=doc.description if description is None else description,
            parameters=parameters,
            limits=limits if limits is not None else ToolLimits(),
            fn=fn,
            args_model=model,
            bindings=tuple(bindings),
            accepts_extra=accepts_extra,
        )

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Call the wrapped function directly (no validation, no limits)."""
        return self.fn(*args, **kwargs)

    def with_schema(self, schema: Mapping[str, Any]) -> Self:
        """Present another schema; its properties must still be parameters of the function."""
        function = normalize_function_schema(schema)
        properties = function.get("parameters", {}).get("properties", {})
        known = {b.param for b in self.bindings if b.key is not None}
        unknown = sorted(set(properties) - known)
        if unknown and not self.accepts_extra:
            raise UserError(
                f"tool {self.name!r}: schema property {unknown[0]!r} is not a parameter of "
                f"{_callable_name(self.fn)}() (parameters: {', '.join(sorted(known)) or 'none'})"
            )
        return super().with_schema(schema)

    def _validate(self, arguments: Mapping[str, Any]) -> BaseModel:
        try:
            return self.args_model.model_validate(dict(arguments))
        except ValidationError as exc:
            details = "; ".join(_describe_error(e) for e in exc.errors())
            raise ToolArgumentError(f"invalid arguments for tool {self.name!r}: {details}") from exc

    def check_arguments(self, arguments: Mapping[str, Any]) -> None:
        """Validate with the signature's pydantic model (names the bad argument)."""
        self._validate(arguments)

    async def call(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        """Validate, call the function (a sync one in a worker thread, abandoned on timeout)
        and normalize its result."""
        model = self._validate(arguments)
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        for binding in self.bindings:
            value = context if binding.key is None else getattr(model, binding.key)
            if binding.positional:
                args.append(value)
            else:
                kwargs[binding.param] = value
        if self.accepts_extra and model.model_extra:
            kwargs.update(model.model_extra)
        fn: Callable[..., Any] = self.fn
        if _is_async(fn):
            value = await fn(*args, **kwargs)
        else:
            value = await anyio.to_thread.run_sync(
                functools.partial(fn, *args, **kwargs), abandon_on_cancel=True
            )
            if inspect.isawaitable(value):
                value = await value
        return to_tool_result(value)


@overload
def function_tool(fn: Callable[P, R], /) -> FunctionTool[P, R]: ...


@overload
def function_tool(
    *,
    name: str | None = None,
    description: str | None = None,
    limits: ToolLimits | None = None,
) -> Callable[[Callable[P, R]], FunctionTool[P, R]]: ...


def function_tool(
    fn: Callable[P, R] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    limits: ToolLimits | None = None,
) -> FunctionTool[P, R] | Callable[[Callable[P, R]], FunctionTool[P, R]]:
    """Decorator: turn a function into a :class:`FunctionTool` (bare or with options)."""

    def wrap(func: Callable[P, R]) -> FunctionTool[P, R]:
        return FunctionTool.from_function(func, name=name, description=description, limits=limits)

    if fn is not None:
        return wrap(fn)
    return wrap
