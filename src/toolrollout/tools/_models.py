"""Pydantic models of the tool-config file (verl's layout, so verl configs validate as they
are; our limit keys live in ``config`` next to the tool's own keys)."""

from __future__ import annotations

import builtins
import importlib
from dataclasses import replace
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from toolrollout._exceptions import (
    ToolError,
    ToolExecutionError,
    ToolTimeout,
    ToolUnavailable,
)

from ._types import CircuitBreakerPolicy, RetryPolicy, ToolLimits

__all__ = [
    "CircuitBreakerConfigModel",
    "FunctionSchemaModel",
    "RetryConfigModel",
    "ToolConfigFileModel",
    "ToolEntryConfigModel",
    "ToolEntryModel",
    "ToolSchemaModel",
]


def key_path(loc: tuple[int | str, ...]) -> str:
    """A pydantic error's ``loc`` as ``tools[0].config.timeout``."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


class FunctionSchemaModel(BaseModel):
    """The ``function`` object of an OpenAI tool schema (verl's ``OpenAIFunctionSchema``)."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool = False


class ToolSchemaModel(BaseModel):
    """An OpenAI tool schema, handed to verl tool classes when verl is not installed."""

    model_config = ConfigDict(extra="allow")

    type: Literal["function"] = "function"
    function: FunctionSchemaModel


_TOOL_ERRORS: dict[str, type[ToolError]] = {
    "ToolUnavailable": ToolUnavailable,
    "ToolTimeout": ToolTimeout,
    "ToolExecutionError": ToolExecutionError,
}
"""The errors a circuit breaker may count, by the name used in configs and ``error_kind``."""

_RETRY_BUILTINS = ("ToolUnavailable", "ToolTimeout", "ConnectionError", "TimeoutError", "OSError")


def resolve_exception(name: str) -> type[BaseException]:
    """An exception class from a config name: a toolrollout tool error, a builtin such as
    ``ConnectionError``, or a dotted path such as ``httpx.TransportError``."""
    if name in _TOOL_ERRORS:
        return _TOOL_ERRORS[name]
    if "." not in name:
        obj = getattr(builtins, name, None)
        if isinstance(obj, type) and issubclass(obj, BaseException):
            return obj
        raise PydanticCustomError(
            "exception_name",
            "unknown error type: use one of {known} or a dotted path like 'httpx.TransportError'",
            {"name": name, "known": ", ".join(_RETRY_BUILTINS)},
        )
    module_name, _, attr = name.rpartition(".")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise PydanticCustomError(
            "exception_import", "cannot import it: {error}", {"error": str(exc)}
        ) from exc
    if not (isinstance(obj, type) and issubclass(obj, BaseException)):
        raise PydanticCustomError("exception_type", "is not an exception class", {"name": name})
    return obj


def _check_exception_name(name: str) -> str:
    resolve_exception(name)
    return name


ExceptionName = Annotated[str, AfterValidator(_check_exception_name)]


class RetryConfigModel(BaseModel):
    """``config.retries`` in its long form (unset keys keep the tool's own policy)."""

    model_config = ConfigDict(extra="forbid")

    retries: NonNegativeInt | None = None
    """Extra attempts after the first."""
    attempts: PositiveInt | None = None
    """Total attempts (``retries + 1``); give this or ``retries``, not both."""
    backoff: NonNegativeFloat | None = None
    """Seconds before the first retry (doubled for each later one), plus up to as much
    again at random."""
    max_backoff: NonNegativeFloat | None = None
    on_timeout: bool | None = None
    """Retry a call whose attempt hit ``timeout`` (same as listing ``ToolTimeout``)."""
    retry_on: list[ExceptionName] | None = None
    """Errors retried, replacing the default ``[ToolUnavailable, ConnectionError]``."""

    @model_validator(mode="after")
    def _one_count(self) -> Self:
        if self.retries is not None and self.attempts is not None:
            raise PydanticCustomError(
                "retries_and_attempts", "give either 'retries' or 'attempts', not both"
            )
        return self


class CircuitBreakerConfigModel(BaseModel):
    """``config.circuit_breaker``: fail fast after consecutive infrastructure failures."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    """``false`` removes a breaker the tool has by default (``circuit_breaker: false``)."""
    failure_threshold: PositiveInt = 5
    """Consecutive failed calls (after their retries) that open the breaker."""
    reset_timeout: PositiveFloat = 30.0
    """Seconds the breaker stays open before one trial call."""
    trip_on: list[Literal["ToolUnavailable", "ToolTimeout", "ToolExecutionError"]] | None = None
    """Error kinds that count as failures (default: all three)."""

    @field_validator("trip_on")
    @classmethod
    def _not_empty(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and not value:
            raise PydanticCustomError("empty_list", "must name at least one error kind")
        return value

    def to_policy(self) -> CircuitBreakerPolicy:
        """The breaker policy these keys describe."""
        if self.trip_on is None:
            return CircuitBreakerPolicy(self.failure_threshold, self.reset_timeout)
        trip_on = tuple(dict.fromkeys(_TOOL_ERRORS[name] for name in self.trip_on))
        return CircuitBreakerPolicy(self.failure_threshold, self.reset_timeout, trip_on)


class ToolEntryConfigModel(BaseModel):
    """An entry's ``config``: ``type``, our limit keys, and the tool's own keys (kept)."""

    model_config = ConfigDict(extra="allow")

    type: str = "native"
    """The tool type whose builder makes the entry's tools (a registered name)."""
    timeout: PositiveFloat | None = None
    max_concurrency: PositiveInt | None = None
    num_workers: PositiveInt | None = None
    """verl's name for a tool's worker pool size; read as ``max_concurrency`` if that is unset."""
    rate_limit: PositiveFloat | None = None
    rate_burst: PositiveInt | None = None
    retries: RetryConfigModel | None = None
    circuit_breaker: CircuitBreakerConfigModel | None = None
    """A mapping (or ``true`` for the defaults) adds a breaker; ``false`` removes one the tool
    has by default."""

    @field_validator("type")
    @classmethod
    def _registered_type(cls, value: str, info: ValidationInfo) -> str:
        known = (info.context or {}).get("tool_types")
        if known is not None and value not in known:
            names = [repr(name) for name in known]
            expected = " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)
            raise PydanticCustomError(
                "literal_error", "Input should be {expected}", {"expected": expected}
            )
        return value

    @field_validator("retries", mode="before")
    @classmethod
    def _short_retries(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return {"retries": value}
        return value

    @field_validator("circuit_breaker", mode="before")
    @classmethod
    def _breaker_switch(cls, value: Any) -> Any:
        if isinstance(value, bool):
            return {"enabled": value}
        return value

    def to_limits(self, base: ToolLimits) -> ToolLimits:
        """``base`` (the tool's own limits) with the keys set here applied over it."""
        changes: dict[str, Any] = {}
        if self.timeout is not None:
            changes["timeout"] = self.timeout
        concurrency = self.max_concurrency if self.max_concurrency is not None else self.num_workers
        if concurrency is not None:
            changes["max_concurrency"] = concurrency
        if self.rate_limit is not None:
            changes["rate_limit"] = self.rate_limit
        if self.rate_burst is not None:
            changes["rate_burst"] = self.rate_burst
        if self.retries is not None:
            changes["retry"] = self._retry(base)
        if self.circuit_breaker is not None:
            breaker = self.circuit_breaker
            changes["circuit_breaker"] = breaker.to_policy() if breaker.enabled else None
        return replace(base, **changes)

    def _retry(self, base: ToolLimits) -> RetryPolicy:
        assert self.retries is not None
        cfg = self.retries
        retry: dict[str, Any] = {}
        if cfg.retries is not None:  # verl's layout counts retries; the policy counts attempts
            retry["max_attempts"] = cfg.retries + 1
        if cfg.attempts is not None:
            retry["max_attempts"] = cfg.attempts
        if cfg.backoff is not None:  # the first wait, and as much random extra on top of it
            retry["initial_backoff"] = retry["jitter"] = cfg.backoff
        if cfg.max_backoff is not None:
            retry["max_backoff"] = cfg.max_backoff
        if cfg.on_timeout is not None:
            retry["retry_timeouts"] = cfg.on_timeout
        if cfg.retry_on is not None:
            names = [name for name in cfg.retry_on if name != "ToolTimeout"]
            retry["retry_on"] = tuple(dict.fromkeys(resolve_exception(name) for name in names))
            if "ToolTimeout" in cfg.retry_on:
                retry["retry_timeouts"] = True
        return replace(base.retry, **retry)


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
