"""Run verl ``BaseTool`` classes unchanged, so custom verl tools keep working.

verl tools are stateful objects driven as ``create -> execute -> release`` per call (what
verl's ``ToolAgentLoop`` does); :class:`VerlToolAdapter` drives them the same way and maps
the ``(ToolResponse, reward, metrics)`` triple onto a :class:`ToolResult`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._base import Tool
from ._models import ToolSchemaModel
from ._types import ToolContext, ToolResult

__all__ = ["VerlToolAdapter", "is_verl_tool_class"]

_VERL_METHODS = ("create", "execute", "release", "get_openai_tool_schema")


def is_verl_tool_class(obj: object) -> bool:
    """True for classes shaped like verl's ``BaseTool`` (duck-typed: verl is optional)."""
    return isinstance(obj, type) and all(callable(getattr(obj, m, None)) for m in _VERL_METHODS)


def _schema_object(tool_schema: Mapping[str, Any]) -> Any:
    """verl's own schema model when verl is installed (its tools may rely on it), else ours."""
    try:
        from verl.tools.schemas import OpenAIFunctionToolSchema
    except ImportError:
        return ToolSchemaModel.model_validate(dict(tool_schema))
    return OpenAIFunctionToolSchema.model_validate(dict(tool_schema))


def _schema_dict(schema: Any) -> dict[str, Any]:
    if isinstance(schema, Mapping):
        return dict(schema)
    dump = getattr(schema, "model_dump", None)
    if dump is None:
        raise TypeError(f"unsupported tool schema object {type(schema).__name__}")
    return dict(dump(exclude_none=True))


@dataclass(frozen=True, kw_only=True)
class VerlToolAdapter(Tool):
    """A verl ``BaseTool`` instance behind the :class:`Tool` interface."""

    instance: Any = field(repr=False, compare=False)
    """The verl tool object."""

    @classmethod
    def build(
        cls, tool_class: type, config: Mapping[str, Any], tool_schema: Mapping[str, Any] | None
    ) -> VerlToolAdapter:
        """Instantiate ``tool_class(config=..., tool_schema=...)`` as verl's registry does."""
        schema_obj = None if tool_schema is None else _schema_object(tool_schema)
        instance = tool_class(config=dict(config), tool_schema=schema_obj)
        function = _schema_dict(instance.get_openai_tool_schema()).get("function", {})
        return cls(
            name=str(getattr(instance, "name", function.get("name", ""))),
            description=str(function.get("description", "")),
            parameters=function.get("parameters") or {"type": "object", "properties": {}},
            instance=instance,
        )

    async def call(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        """``create`` an instance (with the row's ``create_kwargs``), ``execute``, ``release``."""
        tools_kwargs = context.metadata.get("tools_kwargs") or {}
        create_kwargs = dict((tools_kwargs.get(self.name) or {}).get("create_kwargs") or {})
        if context.ground_truth is not None:
            create_kwargs.setdefault("ground_truth", context.ground_truth)
        instance_id, _ = await self.instance.create(create_kwargs=create_kwargs)
        try:
            response, reward, metrics = await self.instance.execute(instance_id, dict(arguments))
        finally:
            await self.instance.release(instance_id)
        if isinstance(response, str):  # verl < 0.5 tools returned plain text
            return ToolResult(text=response, reward=None if reward is None else float(reward))
        images = getattr(response, "image", None) or ()
        return ToolResult(
            text=getattr(response, "text", None) or "",
            images=tuple(images),
            reward=None if reward is None else float(reward),
            metrics=dict(metrics or {}),
        )
