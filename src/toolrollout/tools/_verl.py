"""Run verl ``BaseTool`` classes unchanged, as :class:`StatefulTool` objects.

Call conventions follow current verl: ``create(instance_id, create_kwargs={...})``, the
other kwargs passed as keyword arguments, as its SGLang rollout did.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._lifecycle import StatefulTool
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
class VerlToolAdapter(StatefulTool):
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

    def create_kwargs_for(self, context: ToolContext) -> dict[str, Any]:
        """The row's ``create_kwargs``, with the row's ground truth as a default."""
        create_kwargs = super().create_kwargs_for(context)
        if context.ground_truth is not None:
            create_kwargs.setdefault("ground_truth", context.ground_truth)
        return create_kwargs

    async def create(self, instance_id: str, **create_kwargs: Any) -> str:
        """verl's ``create``; returns the id the tool chose."""
        created = await self.instance.create(instance_id, create_kwargs=create_kwargs)
        if isinstance(created, tuple):
            created = created[0]
        return instance_id if created is None else str(created)

    async def execute(
        self, instance_id: str, parameters: Mapping[str, Any], **execute_kwargs: Any
    ) -> ToolResult:
        """verl's ``execute``, its ``(ToolResponse, reward, metrics)`` mapped to a result."""
        response, reward, metrics = await self.instance.execute(
            instance_id, dict(parameters), **execute_kwargs
        )
        if isinstance(response, str):  # verl < 0.5 tools returned plain text
            return ToolResult(text=response, reward=None if reward is None else float(reward))
        images = getattr(response, "image", None) or ()
        return ToolResult(
            text=getattr(response, "text", None) or "",
            images=tuple(images),
            reward=None if reward is None else float(reward),
            metrics=dict(metrics or {}),
        )

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float | None:
        """verl's ``calc_reward`` (tools without one give no reward)."""
        method = getattr(self.instance, "calc_reward", None)
        if method is None:
            return None
        value = await method(instance_id, **kwargs)
        return None if value is None else float(value)

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """verl's ``release``."""
        await self.instance.release(instance_id, **kwargs)
