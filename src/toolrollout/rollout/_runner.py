"""The library entry point: a batch of prompts in, trajectories out.

All trajectories of a call run at once in one task group, gated only by the cap on
in-flight engine requests; a finished one is handed to ``on_result`` at once. Straggler
control (:meth:`RolloutRunner.run_batch`, docs/rollouts.md) stops at a target of groups.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Coroutine,
    Iterable,
    Mapping,
    Sequence,
)
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import replace
from typing import Any, Concatenate, Literal, ParamSpec, Self, TypeVar

import anyio
import anyio.abc
import anyio.lowlevel

from toolrollout._exceptions import EngineError, InexactLogprobsError, UserError
from toolrollout._records import ResumePoint, RolloutPrompt, Trajectory, TrajectoryStatus
from toolrollout.chat import ChatFormat, VisionFormat
from toolrollout.chat.parsers import get_tool_parser
from toolrollout.engines._base import Engine
from toolrollout.engines._limiter import OrderedLimiter
from toolrollout.engines._priority import WorkHistory
from toolrollout.engines._scheduling import Scheduler
from toolrollout.engines._types import SamplingParams
from toolrollout.rewards import WeightedReward, combine
from toolrollout.tools import Tool, ToolExecutor, open_tools, share_tools

from ._batch import (
    Job,
    RolloutBatch,
    Tally,
    admission_watch,
    failed_trajectory,
    gather,
    group_ids_for,
    run_sample,
    start_in_batches,
)
from ._config import RolloutConfig
from ._defaults import VisionMode, default_rewards, detect_vision, tokenizer_folder
from ._hooks import TrajectoryHooks
from ._interactions import check_interactions
from ._resume_payload import resume_prompt
from ._types import PromptLike, RolloutShared, StopControl, as_prompt, prerender_prompts

__all__ = ["RolloutRunner", "failed_trajectory"]

logger = logging.getLogger(__name__)


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _opens_tools(
    method: Callable[Concatenate[RolloutRunner, _P], Coroutine[Any, Any, _R]],
) -> Callable[Concatenate[RolloutRunner, _P], Coroutine[Any, Any, _R]]:
    """Run ``method`` with the runner's tool services open, once the engine's context
    length is known and its logprobs were checked."""

    @functools.wraps(method)
    async def opened(self: RolloutRunner, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        if not self._engine_asked:
            await self._ask_context_length()
        await self._check_logprobs()
        async with self._tools_open():
            return await method(self, *args, **kwargs)

    return opened


class RolloutRunner:
    """Runs multi-turn tool rollouts against one engine.

    ``tokenizer`` is the Hugging Face tokenizer of the served model (its chat template
    renders the prompt and the tool deltas). ``tools`` are executed for real.
    ``interactions`` (by name) answer final turns of the rows that name one in
    ``extra_info.interaction_kwargs.name``. ``vision`` turns on images in tool results for
    a vision-language model; without it, images are left out and the message says so.

    Defaults: ``rewards="auto"`` picks the terms each call's ground truths call for
    (:func:`~toolrollout.spec.default_rewards`, plus ``tool_error_penalty``),
    ``vision="auto"`` reads the tokenizer's model folder, and without a context length the
    engine's is asked for (``engine.info()``) at the first call.

    The tools' services (:meth:`Tool.services <toolrollout.tools.Tool.services>`) are
    opened by ``async with runner:`` once for every call inside it; on a runner not
    entered, a call opens them and the calls that overlap it share them.
    """

    _tools_held: AbstractAsyncContextManager[object] | None = None
    """The open services while ``async with runner:`` holds them."""

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        tools: Iterable[Tool] | ToolExecutor,
        *,
        config: RolloutConfig | None = None,
        rewards: Sequence[Callable[[Trajectory], Any] | WeightedReward] | Literal["auto"] = "auto",
        tool_error_penalty: float = 0.0,
        context_length: int | None = None,
        interactions: Mapping[str, Any] | None = None,
        vision: VisionFormat | VisionMode | None = "auto",
        hooks: TrajectoryHooks | None = None,
    ) -> None:
        self.engine = engine
        self.config = config or RolloutConfig()
        self.tools = tools if isinstance(tools, ToolExecutor) else ToolExecutor(list(tools))
        self.chat = ChatFormat(
            tokenizer,
            tools=self.tools.schemas(),
            family=self.config.family,
            template_kwargs=self.config.chat_template_kwargs,
        )
        # The schemas type the arguments of formats that carry no types (GLM-4.5...).
        self.parser = get_tool_parser(
            self.config.tool_parser or self.chat.family.tool_parser, tools=self.chat.tools
        )
        self._reward_terms = rewards
        self._tool_error_penalty = tool_error_penalty
        self.context_length = self.config.context_length or context_length
        """The context budget: ``config.context_length``, else the one given, else the
        engine's (``engine.info()``, asked at the first call)."""
        self._engine_asked = self.context_length is not None
        self.interactions: dict[str, Any] = dict(interactions or {})
        folder = tokenizer_folder(tokenizer)
        self.vision = detect_vision(folder, vision) if vision is not None else None
        self.hooks = hooks or TrajectoryHooks()
        self._runs = 0
        """Calls made so far (run, run_batch, resume): each draws its own seeds."""
        self._logprobs_checked = False
        self._logprob_label: str | None = None
        """The engine's reason its logprobs are not the checkpoint's, when the config says
        to run anyway and label every trajectory with it."""
        sched = self.config.scheduling
        self.work_history = WorkHistory() if sched is not None and sched.history else None
        """With ``SchedulingConfig.history``: the lengths of each prompt's trajectories so
        far, kept from one call to the next (a trainer's steps); replace it with
        ``WorkHistory.from_dict`` to carry it over from another process."""

    async def _ask_context_length(self) -> None:
        """The engine's context length, asked once; an engine that cannot answer yet is
        asked again at the next call (a run goes on when its engine is down)."""
        try:
            self.context_length = (await self.engine.info()).context_length
        except EngineError as exc:
            logger.warning("engine info unavailable, context length unknown for now: %s", exc)
        else:
            self._engine_asked = True

    async def _check_logprobs(self) -> None:
        """Ask the engine once whether its logprobs are exact for the run's sampling; refuse
        or label as ``config.inexact_logprobs`` says (no answer yet: asked again next call)."""
        if self._logprobs_checked:
            return
        try:
            reason = await self.engine.logprob_mismatch(self.config.sampling)
        except EngineError as exc:
            logger.warning("engine cannot say yet whether its logprobs are exact: %s", exc)
            return
        if reason is not None and self.config.inexact_logprobs == "refuse":
            raise InexactLogprobsError(
                f"{reason} (or set {{config.inexact_logprobs}} to 'label' to run and label "
                "every row)",
                "config.inexact_logprobs",
            )
        self._logprob_label = reason
        self._logprobs_checked = True

    def _check_rows(self, prompts: Sequence[PromptLike]) -> list[RolloutPrompt]:
        rows = [as_prompt(p) for p in prompts]
        names = [str(index) for index in range(len(rows))]
        check_interactions(self.interactions, rows, source="prompt", names=names)
        return rows

    def _rewards(self, truths: Iterable[object]) -> list[WeightedReward]:
        """The call's reward: the given terms, or for ``"auto"`` those its truths call for."""
        terms = self._reward_terms
        if terms == "auto":
            terms = default_rewards(truths, tool_error_penalty=self._tool_error_penalty)
        return combine(*terms)

    def _shared(
        self,
        truths: Iterable[object],
        stop: StopControl | None = None,
        sampling: SamplingParams | None = None,
    ) -> RolloutShared:
        seed_round, self._runs = self._runs, self._runs + 1
        config = self.config if sampling is None else replace(self.config, sampling=sampling)
        return RolloutShared(
            seed_round=seed_round,
            engine=self.engine,
            chat=self.chat,
            parser=self.parser,
            tools=self.tools,
            config=config,
            rewards=self._rewards(truths),
            engine_limiter=OrderedLimiter(self.config.concurrency),
            drift_limiter=anyio.CapacityLimiter(1),
            context_length=self.context_length,
            interactions=self.interactions,
            vision=self.vision,
            stop=stop,
            scheduler=self._scheduler(),
        )

    def _scheduler(self) -> Scheduler | None:
        """The run's client-side scheduling policies (issue 20), if any are configured."""
        sched = self.config.scheduling
        if sched is None or not sched.enabled:
            return None
        return Scheduler(
            sched,
            self.engine,
            group_size=self.config.n,
            ceiling=self.config.concurrency,
            history=self.work_history,
        )

    async def __aenter__(self) -> Self:
        """Open the tools' services for every call until the block ends."""
        if self._tools_held is not None:
            raise UserError("this RolloutRunner is entered already")
        held = open_tools(self.tools)
        await held.__aenter__()
        self._tools_held = held
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        held, self._tools_held = self._tools_held, None
        if held is not None:
            await held.__aexit__(*exc_info)

    @asynccontextmanager
    async def _tools_open(self) -> AsyncIterator[None]:
        """The services for one call: the entered runner's, or a shared opening
        (:func:`~toolrollout.tools.share_tools`)."""
        if self._tools_held is not None:
            yield
            return
        async with share_tools(self.tools):
            yield

    @_opens_tools
    async def run(
        self,
        prompts: Sequence[PromptLike],
        *,
        on_result: Callable[[Trajectory], None] | None = None,
        group_ids: Sequence[str] | None = None,
        skip: Collection[tuple[int, int]] = (),
        sampling: SamplingParams | None = None,
    ) -> list[Trajectory]:
        """Roll out ``config.n`` samples of every prompt; results ordered by (prompt, sample).

        ``sampling`` replaces ``config.sampling`` for this call only (a trainer's validation
        temperature), so one runner, with its tools' limits and statistics, serves both.

        Every sample yields exactly one trajectory, whatever goes wrong inside it: an
        unexpected exception or ``config.trajectory_timeout`` gives a ``failed`` row with the
        error. ``skip`` lists (prompt_index, sample_index) pairs already done (a resumed
        run): they are not run and not returned.
        """
        rows = self._check_rows(prompts)
        places = self._places(rows, group_ids, skip)
        shared = self._shared((r.ground_truth for r in rows), sampling=sampling)
        n = self.config.n
        results: list[Trajectory | None] = [None] * (len(rows) * n)

        async def one(group_id: str, prompt_index: int, sample_index: int) -> None:
            place = (group_id, prompt_index, sample_index)
            trajectory = await self._sample(shared, rows[prompt_index], place)()
            results[prompt_index * n + sample_index] = trajectory
            if on_result is not None:
                on_result(trajectory)

        def prepare(batch: Sequence[tuple[Any, ...]]) -> None:
            prerender_prompts(shared, (rows[p].messages for _, p, _ in batch))

        async with admission_watch(shared), anyio.create_task_group() as tg:
            await start_in_batches(tg, one, places, prepare)
        return [t for t in results if t is not None]

    def _places(
        self, rows: Sequence[RolloutPrompt], group_ids: Sequence[str] | None, skip: Collection[Any]
    ) -> list[tuple[str, int, int]]:
        """(group id, prompt index, sample index) of every sample to run: all but ``skip``."""
        ids, done, n = group_ids_for(rows, group_ids), set(skip), self.config.n
        return [(ids[p], p, s) for p in range(len(rows)) for s in range(n) if (p, s) not in done]

    def _sample(
        self,
        shared: RolloutShared,
        prompt: RolloutPrompt,
        place: tuple[str, int, int],
        resume: ResumePoint | None = None,
    ) -> Callable[[], Awaitable[Trajectory]]:
        """One sample (group id, prompt index, sample index), always to a row
        (:func:`run_sample`), ready to run."""
        return functools.partial(
            run_sample,
            shared,
            prompt,
            place,
            resume,
            hooks=self.hooks,
            logprob_label=self._logprob_label,
        )

    @_opens_tools
    async def run_batch(
        self,
        prompts: Sequence[PromptLike],
        *,
        target_groups: int,
        keep_groups_whole: bool = True,
        on_result: Callable[[Trajectory], None] | None = None,
        group_ids: Sequence[str] | None = None,
        skip: Collection[tuple[int, int]] = (),
        until: anyio.Event | None = None,
    ) -> RolloutBatch:
        """Oversampling: run every prompt's group, stop at ``target_groups`` complete groups.

        Once the target is met no engine request starts, those in flight are aborted by
        rid and tool calls running are cancelled (``RolloutConfig.tools_at_target``);
        nothing is left running when this returns (docs/rollouts.md). ``on_result`` sees
        every trajectory, aborted ones included.

        ``skip`` lists (prompt_index, sample_index) pairs not to run here (as in
        :meth:`run`; the target counts the groups left). ``until`` is a stop from outside
        (a target shared with other processes): once set, the batch stops as if its
        target were met, and holds the groups complete by then.
        """
        rows = self._check_rows(prompts)
        places = self._places(rows, group_ids, skip)
        launched = len({p for _, p, _ in places})
        if not 1 <= target_groups <= launched:
            raise UserError(
                f"target_groups must be between 1 and the {launched} prompts run, "
                f"got {target_groups}"
            )
        stop = StopControl()
        shared = self._shared((r.ground_truth for r in rows), stop)
        jobs = [
            Job(*place, self._sample(shared, rows[place[1]], place), prompt=rows[place[1]])
            for place in places
        ]
        return await self._gather(
            shared, jobs, stop, target_groups, keep_groups_whole, on_result, until
        )

    @_opens_tools
    async def resume(
        self,
        trajectories: Sequence[Trajectory],
        *,
        target_groups: int | None = None,
        keep_groups_whole: bool = True,
        on_result: Callable[[Trajectory], None] | None = None,
    ) -> RolloutBatch:
        """Continue aborted trajectories (e.g. a previous batch's ``leftover``).

        Each ``aborted`` one goes on from its prompt plus partial output, token for token
        (an open turn is continued); finished ones pass through and count for their group.
        With ``target_groups`` this is a new oversampled batch (:meth:`run_batch`). Tool
        and interaction instances are new. ``on_result`` sees only the ones that were run.
        """
        stop = StopControl()
        shared = self._shared((t.ground_truth for t in trajectories), stop)
        jobs: list[Job] = []
        for trajectory in trajectories:
            place = (trajectory.group_id, trajectory.prompt_index, trajectory.sample_index)
            job = Job(*place, None)
            point = trajectory.resume_point
            if trajectory.status is not TrajectoryStatus.ABORTED:
                job.done = trajectory
            elif point is None:
                raise UserError(
                    f"trajectory {trajectory.uid} is aborted but has no resume point "
                    "(resume points live in memory; rows read back from files have none)"
                )
            else:
                job.run = self._sample(shared, resume_prompt(point), place, point)
            jobs.append(job)
        groups = len({job.group_id for job in jobs})
        if target_groups is None:
            target_groups = groups
        elif not 1 <= target_groups <= groups:
            raise UserError(
                f"target_groups must be between 1 and the {groups} groups given, "
                f"got {target_groups}"
            )
        return await self._gather(shared, jobs, stop, target_groups, keep_groups_whole, on_result)

    async def _gather(
        self,
        shared: RolloutShared,
        jobs: Sequence[Job],
        stop: StopControl,
        target_groups: int,
        keep_groups_whole: bool,
        on_result: Callable[[Trajectory], None] | None,
        until: anyio.Event | None = None,
    ) -> RolloutBatch:
        return await gather(
            shared,
            jobs,
            stop,
            Tally(self.config.n, target_groups, keep_groups_whole),
            cancel_tools=self.config.tools_at_target == "cancel",
            abort=self._abort_one,
            on_result=on_result,
            until=until,
        )

    async def _abort_one(self, rid: str) -> None:
        try:
            await self.engine.abort(rid)
        except EngineError as exc:  # its request ends anyway; the batch is not lost for it
            logger.warning("straggler abort of %s failed: %s", rid, exc)

    def run_sync(self, prompts: Sequence[PromptLike], **kwargs: Any) -> list[Trajectory]:
        """Blocking wrapper around :meth:`run` for scripts and sync trainers."""
        return anyio.run(functools.partial(self.run, prompts, **kwargs))
