"""The composition root: a :class:`RunSpec` in, a running engine and one runner out.

:func:`open_run` is what an application uses (CLI, Ray worker); :func:`build_runner` is the
sync half for callers that already hold an engine and a tokenizer (the trainer adapters).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from toolrollout.engines._factory import connect
from toolrollout.rollout import RolloutRunner
from toolrollout.rollout._defaults import detect_vision, tokenizer_folder
from toolrollout.rollout._interactions import check_interactions

from ._policy import load_tokenizer
from ._spec import RunSpec

if TYPE_CHECKING:
    from toolrollout.chat import VisionFormat
    from toolrollout.engines import Engine
    from toolrollout.interactions import Interaction
    from toolrollout.tools import Tool

__all__ = [
    "OpenRun",
    "RunComponents",
    "build_runner",
    "check_interactions",
    "load_components",
    "open_run",
]


@dataclass(frozen=True)
class RunComponents:
    """What a spec loads before any engine is touched: checks on them can fail early."""

    tokenizer: Any
    tools: tuple[Tool, ...]
    interactions: Mapping[str, Interaction]
    vision: VisionFormat | None

    @property
    def tool_names(self) -> list[str]:
        return sorted(t.name for t in self.tools)


def load_components(spec: RunSpec, *, tokenizer: Any = None) -> RunComponents:
    """The tokenizer (loaded from ``spec.model_path`` unless given), tools, interactions
    and image format of ``spec``. Vision is detected from the model folder: ``spec.model``,
    else the given tokenizer's."""
    from toolrollout.tools import calculator_tool, load_tool_config

    # The tokenizer's own folder when none is named: the rule RolloutRunner(vision="auto") uses.
    folder = spec.model_path if tokenizer is None else spec.model or tokenizer_folder(tokenizer)
    if tokenizer is None:
        tokenizer = load_tokenizer(spec.model_path)
    if spec.tools is not None:
        tools = tuple(spec.tools)
    elif spec.tool_config is not None:
        tools = tuple(load_tool_config(spec.tool_config))
    else:
        tools = (calculator_tool(),)
    interactions: Mapping[str, Interaction]
    if spec.interactions is not None:
        interactions = dict(spec.interactions)
    elif spec.interaction_config is not None:
        from toolrollout.interactions import load_interaction_config

        interactions = load_interaction_config(spec.interaction_config)
    else:
        interactions = {}
    return RunComponents(tokenizer, tools, interactions, detect_vision(folder, spec.vision))


def build_runner(
    spec: RunSpec,
    engine: Engine,
    *,
    tokenizer: Any = None,
    components: RunComponents | None = None,
    context_length: int | None = None,
) -> RolloutRunner:
    """The runner of ``spec`` on an engine the caller holds (and opens and closes).
    ``components``: :func:`load_components`'s (loaded here when not given, with
    ``tokenizer``); ``context_length`` overrides the engine's, ``spec.config``'s wins."""
    if components is None:
        components = load_components(spec, tokenizer=tokenizer)
    return RolloutRunner(
        engine,
        components.tokenizer,
        components.tools,
        config=spec.config,
        rewards=spec.rewards,
        tool_error_penalty=spec.tool_error_penalty,
        context_length=context_length,
        interactions=components.interactions,
        vision=components.vision,
        hooks=spec.hooks,
    )


@dataclass(frozen=True)
class OpenRun:
    """A run ready to go: its engine (open for the block) and its runner."""

    spec: RunSpec
    components: RunComponents
    engine: Engine
    runner: RolloutRunner

    @property
    def tokenizer(self) -> Any:
        return self.components.tokenizer


@asynccontextmanager
async def open_run(
    spec: RunSpec,
    *,
    components: RunComponents | None = None,
) -> AsyncIterator[OpenRun]:
    """Start ``spec``'s engine and tool services, build its runner; close all on exit:
    ``async with open_run(spec) as run: await run.runner.run(prompts)``. ``components``
    from :func:`load_components` avoid loading twice."""
    if components is None:
        components = load_components(spec)
    engine = await connect(
        spec.engine_urls,
        spec.model_path,
        threads=spec.threads,
        health_timeout=spec.health_timeout,
        engine=spec.engine,
        **spec.client_options(),
    )
    async with engine:
        runner = build_runner(spec, engine, components=components)
        async with runner:  # the tools' services (MCP sessions, local sandbox...) open here
            yield OpenRun(spec, components, engine, runner)
