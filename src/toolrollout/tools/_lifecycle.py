"""Per-trajectory tool instances: verl's ``create -> execute* -> calc_reward -> release``.

Each trajectory's :class:`ToolSession` creates each instance once and releases it exactly
once on every way out; the per-sample arguments come from the row as verl lays them out
(``extra_info.tools_kwargs.<tool>.{create,execute,calc_reward,release}_kwargs``).
"""

from __future__ import annotations

import logging
import uuid
from abc import abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio

from toolrollout._exceptions import ToolExecutionError, ToolRolloutError

from ._base import Tool
from ._types import ToolContext, ToolResult

__all__ = ["StatefulTool", "ToolSession", "row_kwargs", "tool_kwargs"]

logger = logging.getLogger(__name__)

_KWARG_KINDS = ("create_kwargs", "execute_kwargs", "calc_reward_kwargs", "release_kwargs")


def row_kwargs(metadata: Mapping[str, Any], key: str) -> dict[str, Any]:
    """A row's ``tools_kwargs`` or ``interaction_kwargs`` (top level, else ``extra_info``)."""
    value = metadata.get(key)
    if value is None:
        extra = metadata.get("extra_info")
        if isinstance(extra, Mapping):
            value = extra.get(key)
    return dict(value) if isinstance(value, Mapping) else {}


def tool_kwargs(metadata: Mapping[str, Any], tool: str, kind: str) -> dict[str, Any]:
    """``tools_kwargs[tool][kind]`` of a row (None, as Parquet reads a missing one: empty)."""
    if kind not in _KWARG_KINDS:
        raise ValueError(f"kind must be one of {_KWARG_KINDS}, got {kind!r}")
    entry = row_kwargs(metadata, "tools_kwargs").get(tool)
    if not isinstance(entry, Mapping):
        return {}
    value = entry.get(kind)
    return dict(value) if isinstance(value, Mapping) else {}


class StatefulTool(Tool):
    """A tool with one instance per trajectory (verl's ``BaseTool`` contract); called
    without a session, each call gets a throwaway instance, as verl's ``ToolAgentLoop``."""

    def create_kwargs_for(self, context: ToolContext) -> dict[str, Any]:
        """The ``create_kwargs`` for this trajectory (default: the row's)."""
        return tool_kwargs(context.metadata, self.name, "create_kwargs")

    @abstractmethod
    async def create(self, instance_id: str, **create_kwargs: Any) -> str:
        """Set up the instance for one trajectory; return the id to use for it."""

    @abstractmethod
    async def execute(
        self, instance_id: str, parameters: Mapping[str, Any], **execute_kwargs: Any
    ) -> ToolResult:
        """Run one call against the instance (raise on failure, as :meth:`Tool.call`)."""

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float | None:
        """The instance's reward once the trajectory has ended (None: no reward)."""
        return None

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """Free what :meth:`create` set up. Called exactly once per instance."""
        return None

    async def call(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        """Execute against the trajectory's instance (created on first use if needed)."""
        session = context.session
        execute_kwargs = tool_kwargs(context.metadata, self.name, "execute_kwargs")
        if session is not None:
            instance_id = await session.instance_for(self, context)
            return await self.execute(instance_id, arguments, **execute_kwargs)
        instance_id = await _create(self, uuid.uuid4().hex, self.create_kwargs_for(context))
        try:
            return await self.execute(instance_id, arguments, **execute_kwargs)
        finally:
            with anyio.CancelScope(shield=True):
                await self.release(instance_id)


async def _create(tool: StatefulTool, instance_id: str, kwargs: Mapping[str, Any]) -> str:
    try:
        created = await tool.create(instance_id, **kwargs)
    except ToolRolloutError:
        raise
    except Exception as exc:
        raise ToolExecutionError(
            f"tool {tool.name!r}: create failed: {type(exc).__name__}: {exc}"
        ) from exc
    return str(created) if created is not None else instance_id


@dataclass(slots=True)
class _Instance:
    tool: StatefulTool
    instance_id: str


class ToolSession:
    """The stateful-tool instances of one trajectory (``instance_id`` shared by its tools)."""

    def __init__(
        self,
        instance_id: str,
        metadata: Mapping[str, Any] | None = None,
        *,
        release_timeout: float = 30.0,
    ) -> None:
        self.instance_id = instance_id
        self.metadata: Mapping[str, Any] = metadata or {}
        self.release_timeout = release_timeout
        self._instances: dict[str, _Instance] = {}
        self._locks: dict[str, anyio.Lock] = {}
        self.release_errors: list[str] = []
        """``"tool: error"`` for each release that raised or timed out (the run goes on)."""

    async def create_declared(self, tools: Iterable[Tool], context: ToolContext) -> None:
        """Create the instances of the stateful tools the row's ``tools_kwargs`` names."""
        declared = row_kwargs(self.metadata, "tools_kwargs")
        for tool in tools:
            if isinstance(tool, StatefulTool) and declared.get(tool.name) is not None:
                await self.instance_for(tool, context)

    async def instance_for(self, tool: StatefulTool, context: ToolContext) -> str:
        """The tool's instance id for this trajectory, creating it on first use."""
        lock = self._locks.setdefault(tool.name, anyio.Lock())
        async with lock:
            existing = self._instances.get(tool.name)
            if existing is not None:
                return existing.instance_id
            instance_id = await _create(tool, self.instance_id, tool.create_kwargs_for(context))
            self._instances[tool.name] = _Instance(tool, instance_id)
            return instance_id

    async def calc_rewards(self) -> dict[str, float]:
        """``calc_reward`` of every live instance, by tool name (None answers left out);
        an error propagates, failing the trajectory rather than scoring it without it."""
        rewards: dict[str, float] = {}
        for name, inst in list(self._instances.items()):
            kwargs = tool_kwargs(self.metadata, name, "calc_reward_kwargs")
            try:
                value = await inst.tool.calc_reward(inst.instance_id, **kwargs)
            except ToolRolloutError:
                raise
            except Exception as exc:
                raise ToolExecutionError(
                    f"tool {name!r}: calc_reward failed: {type(exc).__name__}: {exc}"
                ) from exc
            if value is not None:
                rewards[name] = float(value)
        return rewards

    async def release_all(self) -> None:
        """Release every live instance once, shielded from cancellation and bounded by
        ``release_timeout`` each; failures are logged and kept in :attr:`release_errors`."""
        with anyio.CancelScope(shield=True):
            while self._instances:
                name, inst = self._instances.popitem()
                kwargs = tool_kwargs(self.metadata, name, "release_kwargs")
                try:
                    with anyio.fail_after(self.release_timeout):
                        await inst.tool.release(inst.instance_id, **kwargs)
                except Exception as exc:
                    detail = f"{name}: {type(exc).__name__}: {exc}"
                    self.release_errors.append(detail)
                    logger.warning("tool release failed: %s", detail)
