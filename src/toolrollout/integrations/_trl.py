"""TRL: a ``rollout_func`` for ``GRPOTrainer`` backed by toolrollout's multi-turn loop.

TRL (``GRPOTrainer._generate``) calls ``rollout_func(prompts, trainer)`` with prompts already
repeated ``num_generations`` times and expects ``prompt_ids``, ``completion_ids``,
``logprobs`` and ``env_mask`` (multiplied into the loss mask) per element; every other key
goes to the reward functions. The synchronous call runs the async rollouts on an anyio
blocking portal that this object owns, where the engine and the tools' services are opened.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from toolrollout._exceptions import UserError
from toolrollout.engines._base import Engine
from toolrollout.metrics import rollout_metrics
from toolrollout.rollout import RolloutPrompt, RolloutRunner, Trajectory
from toolrollout.rollout._types import as_prompt
from toolrollout.spec import RunSpec, build_runner, load_components
from toolrollout.tools import open_tools

from ._metrics import cut_extras, trajectory_extras
from ._portal import EnginePortal, engine_at
from ._sampling_check import check_sampling
from ._weight_sync import SYNC_SECONDS_METRIC, SyncResult, WeightSync, WeightSyncMode

__all__ = ["TRLRolloutFunc", "trl_rollout_func"]

ResponseBudget = Literal["trainer", "config"]
"""``trainer``: ``max_response_tokens`` follows the trainer's ``max_completion_length``
(the smaller wins); ``config``: the rollout config's budget, TRL cuts what is longer."""


class TRLRolloutFunc:
    """Callable ``rollout_func(prompts, trainer) -> dict`` for ``trl.GRPOTrainer``.

    One trajectory per element of ``prompts``, in order; tool tokens carry ``env_mask`` 0
    and logprob 0.0, and completions are cut to ``max_completion_length``. ``spec`` is the
    run (``spec.config.n`` must be 1; its engine fields are not used). Use it as a context
    manager, or call :meth:`close` when training ends.
    """

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        spec: RunSpec | None = None,
        *,
        context_length: int | None = None,
        log_metrics: bool = True,
        weight_sync: WeightSyncMode = "auto",
        weights_dir: str | os.PathLike[str] | None = None,
        response_budget: ResponseBudget = "trainer",
    ) -> None:
        if response_budget not in ("trainer", "config"):
            raise UserError(
                f"response_budget must be 'trainer' or 'config', got {response_budget!r}"
            )
        spec = RunSpec() if spec is None else spec
        if spec.config.n != 1:
            raise UserError(
                "TRL repeats each prompt num_generations times itself; use "
                f"RolloutConfig(n=1) in the RunSpec of trl_rollout_func, got n={spec.config.n}"
            )
        self._components = load_components(spec, tokenizer=tokenizer)
        self._spec, self._context_length = spec, context_length
        self.runner = build_runner(
            spec, engine, components=self._components, context_length=context_length
        )
        """The runner of ``config``; see :meth:`runner_for` for the one a call uses."""
        self._runners: dict[int, RolloutRunner] = {spec.config.max_response_tokens: self.runner}
        self.response_budget: ResponseBudget = response_budget
        self._checked_trainer: int | None = None
        self.engine = engine
        self.log_metrics = log_metrics
        self.last_trajectories: list[Trajectory] = []
        """The trajectories of the latest call, for inspection and logging."""
        self._portal = EnginePortal(
            engine,
            lambda stack, portal: stack.enter_context(
                portal.wrap_async_context_manager(open_tools(self._components.tools))
            ),
        )
        self.weight_sync = WeightSync(
            engine,
            self._portal.call,
            mode=weight_sync,
            weights_dir=weights_dir,
        )
        """Loads the trainer's weights into the engine after each optimizer step."""
        self.last_sync: SyncResult | None = None
        """The latest weight sync (None before the first)."""

    def __call__(self, prompts: Sequence[Any], trainer: Any = None) -> dict[str, Any]:
        rows = [_as_rollout_prompt(p) for p in prompts]
        portal = self._portal.portal()
        if trainer is not None and id(trainer) != self._checked_trainer:
            check_sampling(self.runner.config.sampling, getattr(trainer, "args", None))
            self._checked_trainer = id(trainer)
        synced = self.weight_sync.maybe_sync(trainer, _global_step(trainer))
        if synced is not None:
            self.last_sync = synced
            if self.log_metrics:
                _log_to_trainer(trainer, {SYNC_SECONDS_METRIC: synced.seconds})
        limit = _max_completion_length(trainer)
        runner = self.runner_for(limit)
        trajectories: list[Trajectory] = portal.call(runner.run, rows)
        self.last_trajectories = trajectories
        eos = _eos_id(runner.chat.tokenizer)
        args = getattr(trainer, "args", None)
        mask_truncated = bool(getattr(args, "mask_truncated_completions", False))
        out: dict[str, list[Any]] = {
            "prompt_ids": [],
            "completion_ids": [],
            "logprobs": [],
            "env_mask": [],
        }
        extras: list[dict[str, Any]] = []
        for trajectory in trajectories:
            ids = trajectory.response_ids
            mask = trajectory.loss_mask
            logprobs = trajectory.rollout_logprobs
            extra = trajectory_extras(trajectory)
            if limit is not None and len(ids) > limit:
                ids, mask, logprobs = ids[:limit], mask[:limit], logprobs[:limit]
                extra = cut_extras(trajectory, limit, runner.chat, runner.parser)
            if not ids:
                # A failed trajectory has no response; TRL indexes ids[-1], so it gets one
                # untrained EOS (mask 0) and no reward.
                ids, mask, logprobs = [eos], [0], [0.0]
            elif trajectory.failed:
                # Failed (a tool down, an engine error): none of it is trained, whatever a
                # reward function makes of it.
                mask = [0] * len(ids)
            elif mask_truncated and extra["status"] == "truncated":
                # TRL's mask_truncated_completions only sees a last token that is not EOS;
                # a rollout that stopped on a budget right after a model turn ends in EOS.
                mask = [0] * len(ids)
            out["prompt_ids"].append(list(trajectory.prompt_ids))
            out["completion_ids"].append(ids)
            out["logprobs"].append(logprobs)
            out["env_mask"].append(mask)
            extras.append(extra)
        for key in extras[0] if extras else ():
            out[key] = [e[key] for e in extras]
        if self.log_metrics and trainer is not None:
            _log_to_trainer(trainer, rollout_metrics(trajectories))
        return out

    def runner_for(self, limit: int | None) -> RolloutRunner:
        """The runner whose response budget is the trainer's completion limit (with
        ``response_budget="trainer"``), so the loop truncates, not TRL."""
        budget = self._spec.config.max_response_tokens
        if self.response_budget == "trainer" and limit is not None:
            budget = min(budget, limit)
        runner = self._runners.get(budget)
        if runner is None:
            config = dataclasses.replace(self._spec.config, max_response_tokens=budget)
            spec = dataclasses.replace(self._spec, config=config)
            runner = build_runner(
                spec, self.engine, components=self._components, context_length=self._context_length
            )
            self._runners[budget] = runner
        return runner

    def close(self) -> None:
        """Close the tool services and the engine, and stop the event-loop thread."""
        self._portal.close()

    def __enter__(self) -> TRLRolloutFunc:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def trl_rollout_func(
    engine: Engine | str,
    tokenizer: Any,
    spec: RunSpec | None = None,
    **options: Any,
) -> TRLRolloutFunc:
    """Build the ``rollout_func`` to pass to ``GRPOTrainer(..., rollout_func=...)``.

    ``engine`` is an :class:`~toolrollout.Engine` or a SGLang or vLLM server's URL (its
    client takes ``spec``'s client options); do not also pass ``tools=`` to the trainer
    (TRL then ignores ``env_mask``). ``options`` are :class:`TRLRolloutFunc`'s.

    ``weight_sync="auto"`` keeps the run on-policy: when ``trainer.state.global_step``
    differs from the step the engine serves, the trainer's weights go to the engine (saved
    under ``weights_dir``, default ``<output_dir>/weight-sync``, unless in process) and
    ``weight_version`` becomes ``str(global_step)``. ``"off"`` leaves the engine alone.
    """
    spec = RunSpec() if spec is None else spec
    if isinstance(engine, str):
        engine = engine_at(engine, **spec.client_options())
    return TRLRolloutFunc(engine, tokenizer, spec, **options)


def _as_rollout_prompt(prompt: Any) -> RolloutPrompt:
    """TRL passes each row's ``prompt``: a message list, or a plain string. A mapping in the
    dataset layout (``messages``/``prompt``, ``answer``, ``extra_info``) is taken as a
    whole row, so it can name its interaction and carry its ground truth."""
    if isinstance(prompt, str):
        return RolloutPrompt(({"role": "user", "content": prompt},))
    if isinstance(prompt, Mapping):
        return as_prompt(prompt)
    if isinstance(prompt, Sequence) and all(isinstance(m, Mapping) for m in prompt):
        return RolloutPrompt(tuple(dict(m) for m in prompt))
    raise UserError(
        f"a TRL prompt must be a list of chat messages or a string, got {type(prompt).__name__}"
    )


def _global_step(trainer: Any) -> int | None:
    """The optimizer steps the trainer has taken (``trainer.state.global_step``)."""
    step = getattr(getattr(trainer, "state", None), "global_step", None)
    return step if isinstance(step, int) else None


def _max_completion_length(trainer: Any) -> int | None:
    value = getattr(getattr(trainer, "args", None), "max_completion_length", None)
    return int(value) if value else None


def _eos_id(tokenizer: Any) -> int:
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int):
        return eos
    pad = getattr(tokenizer, "pad_token_id", None)
    return int(pad) if isinstance(pad, int) else 0


def _log_to_trainer(trainer: Any, metrics: Mapping[str, float]) -> None:
    """Append to GRPOTrainer's metric buffers (averaged and logged by the trainer)."""
    buffers = getattr(trainer, "_metrics", None)
    if not isinstance(buffers, Mapping):
        return
    model = getattr(trainer, "model", None)
    mode = "train" if getattr(model, "training", True) else "eval"
    target = buffers.get(mode)
    if target is None:
        return
    for name, value in metrics.items():
        if not math.isnan(value):  # a statistic without data (no reward yet) is left out
            target[name].append(value)
