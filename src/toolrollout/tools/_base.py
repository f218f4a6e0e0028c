"""The :class:`Tool` seam: a tool is data (name, description, JSON schema, limits) plus one
async ``call``. Function tools, built-ins, verl adapters, MCP, sandbox and search tools all
implement it, so the executor never needs to know where a tool comes from.

A tool that needs something open while a run uses it (an MCP session, a local server)
declares it with :meth:`Tool.services`; :func:`~toolrollout.tools.open_tools` opens each
distinct :class:`ToolService` once.
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
    """Return the inner ``function`` object of an OpenAI tool schema.

    Accepts both ``{"type": "function", "function": {...}}`` and the bare ``{...}``, since
    configs and libraries use either.
    """
    if schema.get("type") == "function" and isinstance(schema.get("function"), Mapping):
        return dict(schema["function"])
    if "name" in schema:
        return dict(schema)
    raise UserError("a tool schema needs a 'name' (or a 'function' object holding one)")


@runtime_checkable
class ToolService(Protocol):
    """Something tools need open while a run calls them: a session, a local server.

    Tools that need the same thing return services with the same :attr:`key` (e.g. every
    tool of one MCP manager, or two sandbox tools on one port), and it is opened once. Two
    services with one key must be equal, else :func:`~toolrollout.tools.open_tools`
    reports the conflict. A frozen dataclass with a ``key`` property fits.
    """

    @property
    def key(self) -> Hashable:
        """Identifies the thing opened; equal keys are opened once."""
        ...

    def open(self) -> AbstractAsyncContextManager[object]:
        """Open it for the ``async with`` body; close it on exit (also on error/cancel).

        Something already running that this process opened (a manager its owner opened,
        this run's own server) is used as it is and left running.
        """
        ...


@dataclass(frozen=True, kw_only=True)
class Tool(ABC):
    """A tool the model can call.

    Subclasses implement :meth:`call`. Everything else is plain data, so a tool can be
    renamed, re-described or given other limits with :func:`dataclasses.replace` or
    :meth:`with_schema` without touching its code.
    """

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
        """Return a copy presenting another name, description and parameters to the model.

        Used for a config's ``tool_schema``; keys the schema leaves out keep their value.
        """
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
        """Reject arguments before the call takes a concurrency slot or a rate token.

        The default checks only the schema's ``required`` keys; subclasses with a real
        validator (function tools use pydantic) override it.
        """
        required = self.parameters.get("required", ())
        missing = [key for key in required if key not in arguments]
        if missing:
            raise ToolArgumentError(
                f"invalid arguments for tool {self.name!r}: missing required argument(s) "
                + ", ".join(repr(key) for key in missing)
            )

    def services(self) -> Sequence[ToolService]:
        """What must be open while a run calls this tool (default: nothing).

        :func:`~toolrollout.tools.open_tools` (and ``async with`` a runner) opens them
        before the first call and closes them after the last. Raise
        :class:`~toolrollout.UserError` for settings that cannot be served.
        """
        return ()

    @abstractmethod
    async def call(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        """Run the tool once; raise on failure (the executor turns it into an error result)."""

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any], tool_schema: Mapping[str, Any] | None = None
    ) -> Tool:
        """Build the tool from a tool-config entry (``class_name: toolrollout...``).

        ``config`` is the entry's whole ``config`` mapping (limits included), ``tool_schema``
        its optional schema; the loader applies both the schema and the limits afterwards,
        so subclasses only read their own keys.
        """
        raise UserError(f"{cls.__qualname__} cannot be built from a tool config")
