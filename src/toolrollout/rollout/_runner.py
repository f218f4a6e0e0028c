"""The library entry point: a batch of prompts in, trajectories out.

All trajectories of a batch run at once in one task group; the only shared gate is the cap
on in-flight engine requests. There is no turn-level barrier: a trajectory that finishes
early is handed to ``on_result`` at once, and a slow one holds up nobody.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

import anyio

from toolrollout._exceptions import UserError
from toolrollout.chat import ChatFormat, VisionFormat, get_tool_parser
from toolrollout.engines._base import Engine
from toolrollout.rewards import WeightedReward, combine
from toolrollout.tools import Tool, ToolExecutor

from ._config import RolloutConfig
from ._interactions import select_interaction
from ._loop import RolloutPrompt, RolloutServices, run_trajectory
from ._trajectory import Trajectory, TrajectoryStatus

__all__ = ["RolloutRunner", "as_prompt", "failed_trajectory"]


def as_prompt(
    row: RolloutPrompt | Mapping[str, Any] | Sequence[Mapping[str, Any]],
) -> RolloutPrompt:
    """Accept a RolloutPrompt, a ``{"messages": ..., "answer"/"ground_truth": ...}`` row, or
    a bare list of messages."""
    if isinstance(row, RolloutPrompt):
        return row
    if isinstance(row, Mapping):
        messages = row.get("messages", row.get("prompt"))
        if not isinstance(messages, Sequence) or isinstance(messages, str):
            raise UserError("a prompt row needs a 'messages' (or 'prompt') list of messages")
        truth = row.get("ground_truth", row.get("answer"))
        reward_model = row.get("reward_model")
        if truth is None and isinstance(reward_model, Mapping):
            truth = reward_model.get("ground_truth")
        metadata = {
            k: v
            for k, v in row.items()
            if k not in {"messages", "prompt", "ground_truth", "answer"}
        }
        return RolloutPrompt(tuple(dict(m) for m in messages), truth, metadata)
    return RolloutPrompt(tuple(dict(m) for m in row))


def failed_trajectory(
    *,
    group_id: str,
    prompt_index: int,
    sample_index: int,
    prompt: RolloutPrompt,
    reason: str,
    error: str,
) -> Trajectory:
    """The row of a sample whose rollout could not even produce a partial transcript.

    It keeps its place in the output (one row per sample, always) and is flagged
    ``failed`` with the error, so a trainer drops it instead of reading a zero reward.
    """
    return Trajectory(
        uid=f"{group_id}-{sample_index}",
        group_id=group_id,
        prompt_index=prompt_index,
        sample_index=sample_index,
        prompt_ids=(),
        spans=(),
        messages=tuple(dict(m) for m in prompt.messages),
        status=TrajectoryStatus.FAILED,
        finish_reason=reason,
        error=error,
        ground_truth=prompt.ground_truth,
    )


class RolloutRunner:
    """Runs multi-turn tool rollouts against one engine.

    ``tokenizer`` is the Hugging Face tokenizer of the served model (its chat template
    renders the prompt and the tool deltas). ``tools`` are executed for real.
    ``interactions`` (by name, e.g. from :func:`~toolrollout.interactions.load_interaction_config`)
    answer final turns of the rows that name one in ``extra_info.interaction_kwargs.name``.
    ``vision`` (a :class:`~toolrollout.chat.VisionFormat`) turns on images in tool results
    for a vision-language model; without it, images are left out and the message says so.
    """

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        tools: Iterable[Tool] | ToolExecutor,
        *,
        config: RolloutConfig | None = None,
        rewards: Sequence[Callable[[Trajectory], Any] | WeightedReward] = (),
        context_length: int | None = None,
        interactions: Mapping[str, Any] | None = None,
        vision: VisionFormat | None = None,
    ) -> None:
        self.engine = engine
        self.config = config or RolloutConfig()
        self.tools = tools if isinstance(tools, ToolExecutor) else ToolExecutor(list(tools))
        self.chat = ChatFormat(tokenizer, tools=self.tools.schemas())
        self.parser = get_tool_parser(self.config.tool_parser)
        self.rewards = combine(*rewards)
        self.context_length = self.config.context_length or context_length
        self.interactions: dict[str, Any] = dict(interactions or {})
        self.vision = vision

    def _services(self) -> RolloutServices:
        return RolloutServices(
            engine=self.engine,
            chat=self.chat,
            parser=self.parser,
            tools=self.tools,
            config=self.config,
            rewards=self.rewards,
            engine_limiter=anyio.CapacityLimiter(self.config.concurrency),
            context_length=self.context_length,
            interactions=self.interactions,
            vision=self.vision,
        )

    async def run(
        self,
        prompts: Sequence[RolloutPrompt | Mapping[str, Any] | Sequence[Mapping[str, Any]]],
        *,
        on_result: Callable[[Trajectory], None] | None = None,
        group_ids: Sequence[str] | None = None,
        skip: Collection[tuple[int, int]] = (),
    ) -> list[Trajectory]:
        """Roll out ``config.n`` samples of every prompt; results ordered by (prompt, sample).

        Every sample yields exactly one trajectory, whatever goes wrong inside it: an
        unexpected exception or ``config.trajectory_timeout`` gives a ``failed`` row with the
        error. ``skip`` lists (prompt_index, sample_index) pairs already done (a resumed
        run): they are not run and not returned.
        """
        rows = [as_prompt(p) for p in prompts]
        for index, row in enumerate(rows):
            try:
                select_interaction(self.interactions, row)
            except UserError as exc:  # a dataset mistake: say so before anything runs
                raise UserError(f"prompt {index}: {exc}") from exc
        n = self.config.n
        if group_ids is None:
            batch = uuid.uuid4().hex[:8]
            group_ids = [f"{batch}-p{i}" for i in range(len(rows))]
        if len(group_ids) != len(rows):
            raise UserError(f"got {len(group_ids)} group_ids for {len(rows)} prompts")
        done = set(skip)
        services = self._services()
        results: list[Trajectory | None] = [None] * (len(rows) * n)

        async def one(prompt_index: int, sample_index: int) -> None:
            trajectory = await self._run_one(
                services, rows[prompt_index], prompt_index, sample_index, group_ids[prompt_index]
            )
            results[prompt_index * n + sample_index] = trajectory
            if on_result is not None:
                on_result(trajectory)

        async with anyio.create_task_group() as tg:
            for prompt_index in range(len(rows)):
                for sample_index in range(n):
                    if (prompt_index, sample_index) not in done:
                        tg.start_soon(one, prompt_index, sample_index)
        return [t for t in results if t is not None]

    async def _run_one(
        self,
        services: RolloutServices,
        prompt: RolloutPrompt,
        prompt_index: int,
        sample_index: int,
        group_id: str,
    ) -> Trajectory:
        """One sample, always to a row: the loop's own faults, bugs and the deadline."""
        timeout = self.config.trajectory_timeout
        reason = "timeout"
        error = f"TrajectoryTimeout: not finished within trajectory_timeout={timeout} s"
        try:
            with anyio.move_on_after(timeout if timeout is not None else float("inf")):
                return await run_trajectory(
                    services,
                    prompt,
                    prompt_index=prompt_index,
                    sample_index=sample_index,
                    group_id=group_id,
                )
        except Exception as exc:  # a bug in one trajectory must not end the batch
            reason, error = "error", f"{type(exc).__name__}: {exc}"
        return failed_trajectory(
            group_id=group_id,
            prompt_index=prompt_index,
            sample_index=sample_index,
            prompt=prompt,
            reason=reason,
            error=error,
        )

    def run_sync(
        self,
        prompts: Sequence[RolloutPrompt | Mapping[str, Any] | Sequence[Mapping[str, Any]]],
        **kwargs: Any,
    ) -> list[Trajectory]:
        """Blocking wrapper around :meth:`run` for scripts and sync trainers."""

        async def main() -> list[Trajectory]:
            return await self.run(prompts, **kwargs)

        return anyio.run(main)
