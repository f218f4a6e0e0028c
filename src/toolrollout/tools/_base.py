"""The :class:`Tool` seam: a tool is data (name, description, JSON schema, limits) plus one
async ``call``, and declares what must be open while a run uses it (:meth:`Tool.services`).
"""

from __future__ import annotations

import copy
import re
from abc import ABC, abstractmethod
from collections.abc import Hashable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, Self, runtime_checkable

from toolrollout._exceptions import ToolArgumentError, UserError

from ._types import ToolContext, ToolLimits, ToolResult

__all__ = ["Tool", "ToolService", "normalize_function_schema"]

_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
"""OpenAI's rule for function names; chat templates and parsers rely on it too."""


def normalize_function_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The inner ``function`` object of an OpenAI tool schema, or the bare ``{...}``."""
    if schema.get("type") == "function" and isinstance(schema.get("function"), Mapping):
        return dict(schema["function"])
    if "name" in schema:
        return dict(schema)
    raise UserError("a tool schema needs a 'name' (or a 'function' object holding one)")


@runtime_checkable
class ToolService(Protocol):
    """Something tools need open while a run calls them: a session, a local server.

    Services with one :attr:`key` are opened once, and must be equal.
    """

    @property
    def key(self) -> Hashable:
        """Identifies the thing opened; equal keys are opened once."""
        ...

    def open(self) -> AbstractAsyncContextManager[object]:
        """Open it for the ``async with`` body; close it on exit. Something this process
        opened already is used as it is and left running."""
        ...


@dataclass(frozen=True, kw_only=True)
class Tool(ABC):
    """A tool the model can call: subclasses implement :meth:`call`; the rest is data."""

    name: str
    """Function name shown to the model."""
    description: str = ""
    """What the tool does, shown to the model."""
    parameters: Mapping[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )
    """JSON schema of the arguments object."""
    limits: ToolLimits = field(default_factory=ToolLimits)
    """Timeout, concurrency, rate and retry settings the executor applies to this tool."""

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.name):
            raise UserError(
                f"tool name {self.name!r} is invalid: use 1-64 letters, digits, '_' or '-'"
            )
        if self.parameters.get("type", "object") != "object":
            raise UserError(f"tool {self.name!r}: parameters must be a JSON schema of type object")

    def schema(self) -> dict[str, Any]:
        """The OpenAI function-tool schema, as passed in ``tools=[...]`` to a chat template."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": copy.deepcopy(dict(self.parameters)),
            },
        }

    def with_schema(self, schema: Mapping[str, Any]) -> Self:
        """A copy presenting another name, description and parameters (those given)."""
        function = normalize_function_schema(schema)
        return replace(
            self,
            name=function.get("name", self.name),
            description=function.get("description", self.description),
            parameters=function.get("parameters", self.parameters),
        )

    def with_limits(self, limits: ToolLimits) -> Self:
        """Return a copy with other execution limits."""
        return replace(self, limits=limits)

    def check_arguments(self, arguments: Mapping[str, Any]) -> None:
        """Reject arguments before the call takes a slot (default: ``required`` keys only)."""
        required = self.parameters.get("required", ())
        missing = [key for key in required if key not in arguments]
        if missing:
            raise ToolArgumentError(
                f"invalid arguments for tool {self.name!r}: missing required argument(s) "
                + ", ".join(repr(key) for key in missing)
            )

    def services(self) -> Sequence[ToolService]:
        """What :func:`~toolrollout.tools.open_tools` must open while a run calls this tool."""
        return ()

    @abstractmethod
    async def call(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        """Run the tool once; raise on failure (the executor turns it into an error result)."""

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any], tool_schema: Mapping[str, Any] | None = None
    ) -> Tool:
        """Build the tool from a tool-config entry's ``config`` (the loader applies the
        schema and the limit keys afterwards)."""
        raise UserError(f"{cls.__qualname__} cannot be built from a tool config")
