"""Pydantic models of the tool-config file: the one place where untrusted YAML is checked.

The layout is verl's (``tools: [{class_name, config: {type, ...}, tool_schema}]``), so verl
configs validate as they are; our limit keys live in ``config`` next to the tool's own keys,
which pass through untouched.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    field_validator,
)

__all__ = [
    "FunctionSchemaModel",
    "RetryConfigModel",
    "ToolConfigFileModel",
    "ToolEntryConfigModel",
    "ToolEntryModel",
    "ToolSchemaModel",
]

ToolType = Literal["native", "mcp", "sandbox", "search"]


class FunctionSchemaModel(BaseModel):
    """The ``function`` object of an OpenAI tool schema (verl's ``OpenAIFunctionSchema``)."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool = False


class ToolSchemaModel(BaseModel):
    """An OpenAI tool schema (verl's ``OpenAIFunctionToolSchema``); attribute access mirrors
    verl's, so verl tool classes can be handed one when verl itself is not installed."""

    model_config = ConfigDict(extra="allow")

    type: Literal["function"] = "function"
    function: FunctionSchemaModel


class RetryConfigModel(BaseModel):
    """``config.retries`` in its long form (the short form is just the number of retries)."""

    model_config = ConfigDict(extra="forbid")

    retries: NonNegativeInt = 2
    backoff: NonNegativeFloat = 0.1
    max_backoff: NonNegativeFloat = 2.0
    on_timeout: bool = False


class ToolEntryConfigModel(BaseModel):
    """An entry's ``config``: ``type``, our limit keys, and the tool's own keys (kept)."""

    model_config = ConfigDict(extra="allow")

    type: ToolType = "native"
    timeout: PositiveFloat | None = None
    max_concurrency: PositiveInt | None = None
    num_workers: PositiveInt | None = None
    """verl's name for a tool's worker pool size; read as ``max_concurrency`` if that is unset."""
    rate_limit: PositiveFloat | None = None
    rate_burst: PositiveInt | None = None
    retries: RetryConfigModel | None = None

    @field_validator("retries", mode="before")
    @classmethod
    def _short_retries(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return {"retries": value}
        return value


class ToolEntryModel(BaseModel):
    """One item of ``tools``."""

    model_config = ConfigDict(extra="forbid")

    class_name: str = Field(min_length=1)
    config: ToolEntryConfigModel = Field(default_factory=ToolEntryConfigModel)
    tool_schema: ToolSchemaModel | None = None
    mcp: dict[str, Any] | None = None
    """verl <= 0.7.1 MCP settings; reserved for ``type: mcp``."""

    @field_validator("config", mode="before")
    @classmethod
    def _empty_config(cls, value: Any) -> Any:
        # ``config:`` with nothing under it is YAML null; verl treats it as empty.
        return {} if value is None else value


class ToolConfigFileModel(BaseModel):
    """The whole file."""

    model_config = ConfigDict(extra="forbid")

    tools: list[ToolEntryModel]
