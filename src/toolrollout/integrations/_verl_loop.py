"""verl: toolrollout's multi-turn loop as a verl agent loop named ``toolrollout_agent``.

verl 0.9 (``verl/experimental/agent_loop/agent_loop.py``) builds an ``AgentLoopBase`` per
sample; its ``run(sampling_params, **row)`` returns an ``AgentLoopOutput``. This loop
generates through verl's server manager (:class:`VerlServerEngine`), so verl keeps its
replicas and weight syncs; toolrollout brings the tools, budgets and token-exact transcript.

Importing this module imports verl; ``import toolrollout`` never does.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)
from verl.tools.function_tool import FunctionTool as VerlFunctionTool
from verl.tools.function_tool import normalize_function_tool_return

from toolrollout.engines._types import SamplingParams
from toolrollout.rollout import RolloutConfig, RolloutRunner, Trajectory
from toolrollout.rollout._types import as_prompt
from toolrollout.spec import RunSpec, build_runner
from toolrollout.tools import Tool, ToolContext, ToolResult, load_tool_config
from toolrollout.tools._verl import VerlToolAdapter

from ._metrics import trajectory_extras
from ._verl_batch import _num_turns
from ._verl_engine import VerlServerEngine

__all__ = ["AGENT_NAME", "ToolRolloutAgentLoop"]

AGENT_NAME = "toolrollout_agent"


_WORKER_RUNNERS: dict[tuple[Any, ...], tuple[Any, RolloutRunner]] = {}
"""This process's runners, one per agent-loop entry and server manager (with the manager
held, so its id is not reused while the runner lives)."""


@functools.lru_cache(maxsize=16)
def _tools_from_file(path: str) -> tuple[Tool, ...]:
    """One tool set per config file and worker process (verl builds a loop per sample)."""
    return tuple(load_tool_config(path))


@dataclass(frozen=True, kw_only=True)
class _VerlFunctionToolAdapter(Tool):
    """A verl ``@function_tool`` (``FunctionTool``), called and normalised as verl does."""

    function: Any = field(repr=False, compare=False)

    async def call(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        raw = await self.function.call(dict(arguments))
        response, reward, metrics = normalize_function_tool_return(raw)
        return ToolResult(
            text=response.text or "",
            images=tuple(response.image or ()),
            reward=None if reward is None else float(reward),
            metrics=dict(metrics or {}),
        )


def _wrap_verl_tools(tools: Any) -> list[Tool]:
    """verl's already-built tools (``ToolListWrap``): ``BaseTool`` objects and function tools."""
    wrapped: list[Tool] = []
    for tool in getattr(tools, "tools", None) or []:
        function = tool.tool_schema.model_dump(exclude_none=True)["function"]
        common: dict[str, Any] = {
            "name": str(function["name"]),
            "description": str(function.get("description", "")),
            "parameters": function.get("parameters") or {"type": "object", "properties": {}},
        }
        if isinstance(tool, VerlFunctionTool):
            wrapped.append(_VerlFunctionToolAdapter(**common, function=tool))
        else:
            wrapped.append(VerlToolAdapter(**common, instance=tool))
    return wrapped


@register(AGENT_NAME)
class ToolRolloutAgentLoop(AgentLoopBase):  # type: ignore[misc, unused-ignore]
    """A verl agent loop that runs one toolrollout trajectory per dataset row.

    Extra keys of the agent-loop YAML entry arrive as keyword arguments:
    ``tool_config_path`` (else verl's loaded tools are used), ``tool_parser`` (else
    ``multi_turn.format`` unless it is verl's default ``hermes``, else the family's),
    ``family``, ``chat_template_kwargs`` and ``reward`` (a dotted path; its value becomes
    ``reward_score``). Budgets follow verl's config (``max_tool_response_length`` counted in
    tokens here, where verl counts characters).
    """

    def __init__(
        self,
        *args: Any,
        tools: Any = None,
        tool_config_path: str | None = None,
        tool_parser: str | None = None,
        reward: str | None = None,
        family: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        multi_turn = self.rollout_config.multi_turn
        self._tools: list[Tool] = (
            list(_tools_from_file(str(tool_config_path)))
            if tool_config_path
            else _wrap_verl_tools(tools)
        )
        self._tool_source: object = str(tool_config_path) if tool_config_path else id(tools)
        verl_format = multi_turn.get("format")
        self._tool_parser = tool_parser or (
            str(verl_format) if verl_format and verl_format != "hermes" else None
        )
        self._family = family
        self._template_kwargs = dict(chat_template_kwargs or _verl_template_kwargs(self))
        self._reward_path = reward
        self._reward = _load_reward(reward) if reward else None
        self.prompt_length = int(self.rollout_config.prompt_length)
        self.response_length = int(self.rollout_config.response_length)
        self._max_turns = int(multi_turn.get("max_assistant_turns") or 8)
        self._max_tool_tokens = int(multi_turn.get("max_tool_response_length") or 512)
        side = str(multi_turn.get("tool_response_truncate_side") or "middle")
        self._truncate_side = side if side in ("left", "right", "middle") else "middle"

    def _config(self, sampling_params: Mapping[str, Any]) -> RolloutConfig:
        top_k = sampling_params.get("top_k")
        return RolloutConfig(
            sampling=SamplingParams(
                max_new_tokens=self.response_length,
                temperature=float(sampling_params.get("temperature", 1.0)),
                top_p=float(sampling_params.get("top_p", 1.0)),
                top_k=int(top_k) if top_k not in (None, 0) else -1,
            ),
            max_turns=self._max_turns,
            max_response_tokens=self.response_length,
            context_length=self.prompt_length + self.response_length,
            max_tool_response_tokens=self._max_tool_tokens,
            tool_response_truncate_side=self._truncate_side,  # type: ignore[arg-type]
            tool_parser=self._tool_parser,
            family=self._family,
            chat_template_kwargs=self._template_kwargs,
            drift_check=False,
        )

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        (trajectory,) = await self._runner().run(
            [_row(kwargs)], sampling=self._config(sampling_params).sampling
        )
        return self._output(trajectory)

    def _runner(self) -> RolloutRunner:
        """The worker's runner for this entry, shared by every sample of the process, so a
        tool's limits and statistics count the whole worker."""
        key = (
            id(self.server_manager),
            self._tool_source,
            self._tool_parser,
            self._family,
            repr(sorted(self._template_kwargs.items())),
            self._reward_path,
            self.prompt_length,
            self.response_length,
            self._max_turns,
            self._max_tool_tokens,
            self._truncate_side,
        )
        entry = _WORKER_RUNNERS.get(key)
        if entry is None or entry[0] is not self.server_manager:
            engine = VerlServerEngine(
                self.server_manager,
                eos_token_ids=_eos_ids(self.tokenizer),
                context_length=self.prompt_length + self.response_length,
            )
            spec = RunSpec(
                tools=tuple(self._tools),
                config=self._config({}),
                rewards=(self._reward,) if self._reward else (),
                vision="off",
            )
            entry = (self.server_manager, build_runner(spec, engine, tokenizer=self.tokenizer))
            _WORKER_RUNNERS[key] = entry
        return entry[1]

    def _output(self, trajectory: Trajectory) -> AgentLoopOutput:
        ids = trajectory.response_ids[: self.response_length]
        mask = trajectory.loss_mask[: self.response_length]
        logprobs = trajectory.rollout_logprobs[: self.response_length]
        if not ids:
            # A failed trajectory has no response: one untrained EOS keeps verl's shapes.
            ids, mask, logprobs = [_eos_ids(self.tokenizer)[0]], [0], [0.0]
        elif trajectory.failed:
            mask = [0] * len(ids)  # a tool down or an engine error: nothing of it is trained
        extras = trajectory_extras(trajectory)
        extra_fields: dict[str, Any] = {
            "toolrollout": extras,
            # The keys verl's own ToolAgentLoop fills (verl keeps them in every batch).
            "turn_scores": [float(x) for x in trajectory.turn_rewards if x is not None],
            "tool_rewards": [float(x) for x in trajectory.tool_rewards if x is not None],
        }
        if self._reward is not None:
            extra_fields["reward_extra_info"] = {
                "num_tool_calls": trajectory.num_tool_calls,
                "tool_errors": trajectory.tool_errors,
            }
        return AgentLoopOutput(
            prompt_ids=list(trajectory.prompt_ids)[-self.prompt_length :],
            response_ids=ids,
            response_mask=mask,
            response_logprobs=logprobs,
            multi_modal_data={},
            reward_score=trajectory.reward if self._reward is not None else None,
            num_turns=_num_turns({"messages": list(trajectory.messages)}),
            metrics=AgentLoopMetrics(
                generate_sequences=float(trajectory.metrics.get("generation_seconds", 0.0)),
                tool_calls=float(trajectory.metrics.get("tool_seconds", 0.0)),
            ),
            extra_fields=extra_fields,
        )


def _row(kwargs: Mapping[str, Any]) -> Any:
    """verl's row (``raw_prompt``, ``reward_model``, ``extra_info``...) as a rollout prompt."""
    messages = [dict(m) for m in kwargs["raw_prompt"]]
    extra_info = kwargs.get("extra_info") or {}
    row: dict[str, Any] = {
        "messages": messages,
        "reward_model": kwargs.get("reward_model") or {},
        "tools_kwargs": kwargs.get("tools_kwargs") or extra_info.get("tools_kwargs") or {},
        "extra_info": extra_info,
        "data_source": kwargs.get("data_source"),
    }
    return as_prompt(row)


def _eos_ids(tokenizer: Any) -> list[int]:
    eos = getattr(tokenizer, "eos_token_id", None)
    ids = eos if isinstance(eos, list) else [eos]
    return [int(i) for i in ids if i is not None] or [0]


def _load_reward(path: str) -> Any:
    import importlib

    module, _, name = path.replace(":", ".").rpartition(".")
    return getattr(importlib.import_module(module), name)


def _verl_template_kwargs(loop: Any) -> Mapping[str, Any]:
    """verl's ``data.apply_chat_template_kwargs`` (e.g. ``enable_thinking``), if configured."""
    config = getattr(loop, "config", None)
    data = getattr(config, "data", None) if config is not None else None
    getter = getattr(data, "get", None)
    kwargs = getter("apply_chat_template_kwargs") if callable(getter) else None
    return dict(kwargs) if kwargs else {}
