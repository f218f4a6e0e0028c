"""ms-swift: toolrollout's loop as a GRPO multi-turn scheduler named ``toolrollout``.

The whole multi-turn response is one assistant message of ms-swift 4.x's ``RolloutOutput``,
tool-result tokens inside it with loss mask 0 (docs/trainers.md#ms-swift). Importing this
module imports ms-swift; ``import toolrollout`` never does.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from swift.infer_engine.protocol import (
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatMessage,
    RequestConfig,
    RolloutInferRequest,
    RolloutOutput,
    UsageInfo,
)
from swift.rollout.multi_turn import MultiTurnScheduler, multi_turns

from toolrollout._exceptions import UserError
from toolrollout._jsonarg import json_object
from toolrollout.engines._base import Engine
from toolrollout.engines._types import SamplingParams
from toolrollout.rollout import (
    RolloutConfig,
    RolloutPrompt,
    RolloutRunner,
    Trajectory,
    TrajectoryStatus,
)
from toolrollout.spec import RunSpec, build_runner
from toolrollout.tools import Tool, load_tool_config

from ._metrics import trajectory_extras

__all__ = ["SCHEDULER_NAME", "ToolRolloutScheduler", "to_swift_rollout_output"]

SCHEDULER_NAME = "toolrollout"

ENGINE_URL_ENV = "TOOLROLLOUT_ENGINE_URL"
TOOL_CONFIG_ENV = "TOOLROLLOUT_TOOL_CONFIG"
TOOL_PARSER_ENV = "TOOLROLLOUT_TOOL_PARSER"
FAMILY_ENV = "TOOLROLLOUT_FAMILY"
TEMPLATE_KWARGS_ENV = "TOOLROLLOUT_CHAT_TEMPLATE_KWARGS"


def _env_template_kwargs(text: str | None) -> Mapping[str, Any]:
    """``TOOLROLLOUT_CHAT_TEMPLATE_KWARGS``: a JSON object, or a one-line error."""
    return json_object(text, TEMPLATE_KWARGS_ENV) if text else {}


_TRUTH_KEYS = ("ground_truth", "answer", "solution")


def to_swift_rollout_output(
    trajectory: Trajectory, tokenizer: Any, *, model: str = "toolrollout"
) -> RolloutOutput:
    """One trajectory as ms-swift's ``RolloutOutput`` (validated by ms-swift's model)."""
    ids = trajectory.response_ids
    # A failed trajectory (a tool down, an engine error) is never trained.
    mask = [0] * len(ids) if trajectory.failed else trajectory.loss_mask
    logprobs = trajectory.rollout_logprobs
    text = tokenizer.decode(ids, skip_special_tokens=False) if ids else ""
    prompt = [m for m in trajectory.messages[: _prompt_len(trajectory)]]
    messages = [*prompt, {"role": "assistant", "content": text}] if ids else prompt
    finish = "length" if trajectory.status is TrajectoryStatus.TRUNCATED else "stop"
    model_logprobs = [lp for lp, m in zip(logprobs, mask, strict=True) if m == 1]
    choice = ChatCompletionResponseChoice(
        index=0,
        message=ChatMessage(role="assistant", content=text),
        finish_reason=finish,
        token_ids=list(ids),
        logprobs={
            "content": [
                {"token": tokenizer.decode([tok]), "logprob": lp}
                for tok, lp, m in zip(ids, logprobs, mask, strict=True)
                if m == 1
            ]
        },
    )
    response = ChatCompletionResponse(
        model=model,
        choices=[choice],
        usage=UsageInfo(
            prompt_tokens=len(trajectory.prompt_ids),
            completion_tokens=len(ids),
            total_tokens=len(trajectory.prompt_ids) + len(ids),
        ),
        prompt_token_ids=list(trajectory.prompt_ids),
    )
    infos = trajectory_extras(trajectory)
    return RolloutOutput(
        response=response,
        messages=messages,
        response_token_ids=[list(ids)] if ids else [],
        response_loss_mask=[list(mask)] if ids else [],
        rollout_logprobs=[model_logprobs] if ids else [],
        rollout_infos={**infos, "num_turns": trajectory.num_turns},
    )


def _prompt_len(trajectory: Trajectory) -> int:
    """Messages before the first assistant turn are the prompt."""
    for i, message in enumerate(trajectory.messages):
        if message.get("role") == "assistant":
            return i
    return len(trajectory.messages)


class ToolRolloutScheduler(MultiTurnScheduler):  # type: ignore[misc]
    """ms-swift multi-turn scheduler that runs each request as a toolrollout trajectory.

    Each keyword argument is optional; the ``swift rollout`` CLI sets the environment
    variables instead (``TOOLROLLOUT_ENGINE_URL``, ``_TOOL_CONFIG``, ``_TOOL_PARSER``,
    ``_FAMILY``, ``_CHAT_TEMPLATE_KWARGS``). ``request_config.max_tokens`` caps both each
    turn and the whole response.
    """

    def __init__(
        self,
        infer_engine: Any = None,
        max_turns: int | None = None,
        *args: Any,
        engine: Engine | None = None,
        tools: Sequence[Tool] | None = None,
        tool_parser: str | None = None,
        family: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(infer_engine, max_turns, *args, **kwargs)
        self._engine = engine
        self._tools = list(tools) if tools is not None else None
        self._tool_parser = tool_parser or os.environ.get(TOOL_PARSER_ENV) or None
        self._family = family or os.environ.get(FAMILY_ENV) or None
        self._template_kwargs = dict(
            chat_template_kwargs
            if chat_template_kwargs is not None
            else _env_template_kwargs(os.environ.get(TEMPLATE_KWARGS_ENV))
        )
        self._runners: dict[tuple[Any, ...], RolloutRunner] = {}

    def _resolve_engine(self) -> Engine:
        if self._engine is None:
            from ._portal import engine_at

            self._engine = engine_at(_required_env(ENGINE_URL_ENV, "an engine", "engine"))
        return self._engine

    def _resolve_tools(self) -> list[Tool]:
        if self._tools is None:
            self._tools = load_tool_config(_required_env(TOOL_CONFIG_ENV, "tools", "tools"))
        return self._tools

    def _runner(self, request_config: RequestConfig) -> RolloutRunner:
        max_tokens = int(request_config.max_tokens or 512)
        temperature = 1.0 if request_config.temperature is None else request_config.temperature
        top_p = 1.0 if request_config.top_p is None else request_config.top_p
        top_k = -1 if request_config.top_k in (None, 0) else int(request_config.top_k)
        key = (max_tokens, temperature, top_p, top_k, self.max_turns)
        runner = self._runners.get(key)
        if runner is None:
            tokenizer = self.tokenizer
            if tokenizer is None:
                raise UserError("the toolrollout scheduler needs the model's tokenizer")
            config = RolloutConfig(
                sampling=SamplingParams(
                    max_new_tokens=max_tokens,
                    temperature=float(temperature),
                    top_p=float(top_p),
                    top_k=top_k,
                ),
                max_turns=self.max_turns or 8,
                max_response_tokens=max_tokens,
                tool_parser=self._tool_parser,
                family=self._family,
                chat_template_kwargs=self._template_kwargs,
            )
            spec = RunSpec(
                tools=tuple(self._resolve_tools()), config=config, rewards=(), vision="off"
            )
            runner = build_runner(spec, self._resolve_engine(), tokenizer=tokenizer)
            self._runners[key] = runner
        return runner

    async def run(
        self, infer_request: RolloutInferRequest, request_config: RequestConfig, **kwargs: Any
    ) -> RolloutOutput:
        runner = self._runner(request_config)
        messages = [dict(m) for m in infer_request.messages]
        # ms-swift may leave an empty assistant placeholder at the end of the prompt.
        while (
            messages and messages[-1].get("role") == "assistant" and not messages[-1].get("content")
        ):
            messages.pop()
        data = dict(infer_request.data_dict or {})
        truth = next((data[k] for k in _TRUTH_KEYS if data.get(k) is not None), None)
        prompt = RolloutPrompt(tuple(messages), truth, data)
        (trajectory,) = await runner.run([prompt])
        model = _model_name(self.infer_engine)
        return to_swift_rollout_output(trajectory, runner.chat.tokenizer, model=model)


def _required_env(name: str, what: str, argument: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise UserError(
            f"the toolrollout scheduler needs {what}: pass {argument}=... or set {name}"
        )
    return value


def _model_name(infer_engine: Any) -> str:
    info: Mapping[str, Any] | Any = getattr(infer_engine, "model_info", None)
    name = getattr(info, "model_name", None)
    return str(name) if name else "toolrollout"


multi_turns[SCHEDULER_NAME] = ToolRolloutScheduler
