"""The library entry point: a batch of prompts in, trajectories out.

All trajectories of a batch run at once in one task group; the only shared gate is the cap
on in-flight engine requests. There is no turn-level barrier: a trajectory that finishes
early is handed to ``on_result`` at once, and a slow one holds up nobody.

Straggler control (:meth:`RolloutRunner.run_batch`): launch more groups than the batch
needs, stop once ``target_groups`` complete groups are in, abort the rest on the server by
rid, and keep the cut-short trajectories (every token so far) to :meth:`~RolloutRunner.resume`
in a later batch.
"""

from __future__ import annotations

import functools
import logging
import uuid
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
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from dataclasses import dataclass, field, replace
from types import TracebackType
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

from ._config import RolloutConfig
from ._defaults import VisionMode, default_rewards, detect_vision, tokenizer_folder
from ._hooks import TrajectoryHooks
from ._interactions import select_interaction
from ._loop import run_trajectory
from ._state import resume_prompt
from ._types import RolloutShared, StopControl, prerender_prompts

__all__ = ["RolloutBatch", "RolloutRunner", "as_prompt", "failed_trajectory"]

logger = logging.getLogger(__name__)

START_BATCH = 64
"""Trajectories started per turn of the event loop. Each renders its prompt before its
first request, synchronously; started all at once, 10,000 of them blocked the loop for
100 s (docs/benchmarks.md). In batches, the loop serves replies and timers between them."""
ABORT_RESEND_SECONDS = 1.0
"""An abort that reaches SGLang before the request is registered there is dropped, so the
runner names every rid still in flight again after this many seconds."""


@asynccontextmanager
async def _admission_watch(shared: RolloutShared) -> AsyncIterator[None]:
    """The scheduler's loop-lag probe (the ``lag`` policy) for as long as the block runs."""
    scheduler = shared.scheduler
    if scheduler is None:
        yield
        return
    async with scheduler.watching(shared.engine_limiter):
        yield


async def _start_in_batches(
    tg: anyio.abc.TaskGroup,
    func: Callable[..., Coroutine[Any, Any, None]],
    arguments: Sequence[tuple[Any, ...]],
    prepare: Callable[[Sequence[tuple[Any, ...]]], object] | None = None,
) -> None:
    """``tg.start_soon(func, *args)`` for each entry, yielding to the loop every
    :data:`START_BATCH` starts; ``prepare`` sees each batch's entries before they start
    (the runner renders their prompts in one tokenizer call)."""
    for first in range(0, len(arguments), START_BATCH):
        batch = arguments[first : first + START_BATCH]
        if prepare is not None:
            prepare(batch)
        for args in batch:
            tg.start_soon(func, *args)
        if len(batch) == START_BATCH:
            await anyio.lowlevel.checkpoint()


@dataclass(frozen=True, slots=True)
class RolloutBatch:
    """What a run with a batch target returns.

    ``trajectories`` is the batch: ``target_groups`` complete groups (every sample of the
    prompt finished: completed, truncated or failed), or, with ``keep_groups_whole=False``,
    ``target_groups * n`` finished samples from any groups; ordered by (prompt, sample).
    ``leftover`` is every other trajectory: the ``aborted`` ones (each resumable, with its
    tokens so far), their finished siblings, and groups that completed after the target.
    Hand ``leftover`` to :meth:`RolloutRunner.resume` to finish them in a later batch.
    """

    trajectories: tuple[Trajectory, ...]
    leftover: tuple[Trajectory, ...]

    @property
    def partial(self) -> tuple[Trajectory, ...]:
        """The leftover trajectories that were cut short (resumable)."""
        return tuple(t for t in self.leftover if t.status is TrajectoryStatus.ABORTED)


def _finished(trajectory: Trajectory) -> bool:
    return trajectory.status is not TrajectoryStatus.ABORTED


@dataclass(slots=True)
class _Job:
    """One sample to run (or, with ``done``, one already finished and passed through)."""

    group_id: str
    prompt_index: int
    sample_index: int
    run: Callable[[], Awaitable[Trajectory]] | None
    done: Trajectory | None = None
    prompt: RolloutPrompt | None = None
    """A fresh sample's prompt (rendered with its start batch); ``None`` when resumed."""


@dataclass(slots=True)
class _Tally:
    """What a batch has gathered: every result, and which finished samples make the batch."""

    n: int
    target_groups: int
    keep_groups_whole: bool
    results: dict[tuple[str, int], Trajectory] = field(default_factory=dict)
    finished_in_group: dict[str, int] = field(default_factory=dict)
    batch: list[tuple[str, int]] = field(default_factory=list)
    """Keys of the samples in the batch, fixed the moment the target is met."""
    order: list[tuple[str, int]] = field(default_factory=list)
    """Finished samples in the order they finished (for keep_groups_whole=False)."""

    def record(self, job: _Job, trajectory: Trajectory, *, stopping: bool) -> bool:
        """Keep ``job``'s trajectory; True when it is the one that meets the target."""
        key = (job.group_id, job.sample_index)
        self.results[key] = trajectory
        if stopping or not _finished(trajectory):
            return False
        self.order.append(key)
        count = self.finished_in_group.get(job.group_id, 0) + 1
        self.finished_in_group[job.group_id] = count
        size = self.target_groups * self.n
        if self.keep_groups_whole:
            if count == self.n:
                self.batch.extend((job.group_id, s) for s in range(self.n))
            return len(self.batch) >= size
        if len(self.order) < size:
            return False
        self.batch.extend(self.order[:size])
        return True

    def rollout_batch(self) -> RolloutBatch:
        """The batch and the leftover, each in prompt, group and sample order."""
        chosen = set(self.batch)
        ordered = sorted(
            self.results.items(),
            key=lambda kv: (kv[1].prompt_index, kv[0][0], kv[1].sample_index),
        )
        return RolloutBatch(
            trajectories=tuple(t for k, t in ordered if k in chosen),
            leftover=tuple(t for k, t in ordered if k not in chosen),
        )


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


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _opens_tools(
    method: Callable[Concatenate[RolloutRunner, _P], Coroutine[Any, Any, _R]],
) -> Callable[Concatenate[RolloutRunner, _P], Coroutine[Any, Any, _R]]:
    """Run ``method`` with the runner's tool services open (see ``RolloutRunner.__aenter__``),
    once the engine's context length is known and its logprobs were checked
    (:meth:`RolloutRunner._check_logprobs`)."""

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
    ``interactions`` (by name, e.g. from :func:`~toolrollout.interactions.load_interaction_config`)
    answer final turns of the rows that name one in ``extra_info.interaction_kwargs.name``.
    ``vision`` (a :class:`~toolrollout.chat.VisionFormat`) turns on images in tool results
    for a vision-language model; without it, images are left out and the message says so.

    The defaults are the runner's own, however it is built: ``rewards="auto"`` picks the
    terms each call's ground truths call for (:func:`~toolrollout.spec.default_rewards`,
    plus ``tool_error_penalty``), ``vision="auto"`` reads the tokenizer's model folder
    (:func:`~toolrollout.spec.detect_vision`), and without a context length the engine's
    is asked for (``engine.info()``) at the first call.

    The tools' services (MCP sessions, a local sandbox or retriever; see
    :meth:`Tool.services <toolrollout.tools.Tool.services>`) are opened by ``async with
    runner:`` once for every call inside it; on a runner not entered, a call opens them and
    the calls that overlap it share them.
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
        # None: the parser of the model family (Llama-3 JSON calls, Qwen tags...).
        # The schemas let formats that carry no value types (GLM-4.5, Qwen3-Coder) type
        # the arguments.
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
        """The engine's context length, asked once. An engine that cannot answer yet is
        logged and asked again at the next call; this call's rows then fail or succeed
        on their own, each with its cause (a run goes on when its engine is down)."""
        try:
            self.context_length = (await self.engine.info()).context_length
        except EngineError as exc:
            logger.warning("engine info unavailable, context length unknown for now: %s", exc)
        else:
            self._engine_asked = True

    async def _check_logprobs(self) -> None:
        """Ask the engine once whether its logprobs are the checkpoint's for the run's
        sampling; refuse (:class:`InexactLogprobsError`) or keep the reason as the label of
        every trajectory, as ``config.inexact_logprobs`` says. An engine that cannot answer
        yet is logged and asked again at the next call, as for the context length."""
        if self._logprobs_checked:
            return
        try:
            reason = await self.engine.logprob_mismatch(self.config.sampling)
        except EngineError as exc:
            logger.warning("engine cannot say yet whether its logprobs are exact: %s", exc)
            return
        if reason is not None and self.config.inexact_logprobs == "refuse":
            raise InexactLogprobsError(
                f"{reason} (or set RolloutConfig.inexact_logprobs='label', "
                "--inexact-logprobs label, to run and label every row)"
            )
        self._logprob_label = reason
        self._logprobs_checked = True

    def _check_rows(
        self,
        prompts: Sequence[RolloutPrompt | Mapping[str, Any] | Sequence[Mapping[str, Any]]],
    ) -> list[RolloutPrompt]:
        rows = [as_prompt(p) for p in prompts]
        for index, row in enumerate(rows):
            try:
                select_interaction(self.interactions, row)
            except UserError as exc:  # a dataset mistake: say so before anything runs
                raise UserError(f"prompt {index}: {exc}") from exc
        return rows

    @staticmethod
    def _group_ids(rows: Sequence[RolloutPrompt], group_ids: Sequence[str] | None) -> list[str]:
        if group_ids is None:
            batch = uuid.uuid4().hex[:8]
            return [f"{batch}-p{i}" for i in range(len(rows))]
        if len(group_ids) != len(rows):
            raise UserError(f"got {len(group_ids)} group_ids for {len(rows)} prompts")
        return list(group_ids)

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

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        held, self._tools_held = self._tools_held, None
        if held is not None:
            await held.__aexit__(exc_type, exc_val, exc_tb)

    @asynccontextmanager
    async def _tools_open(self) -> AsyncIterator[None]:
        """The services for one call: the entered runner's, or a shared opening.

        On a runner not entered, the first call opens the services and calls that overlap
        it (on this runner, or on another built on the same tools) share them; see
        :func:`~toolrollout.tools.share_tools`.
        """
        if self._tools_held is not None:
            yield
            return
        async with share_tools(self.tools):
            yield

    @_opens_tools
    async def run(
        self,
        prompts: Sequence[RolloutPrompt | Mapping[str, Any] | Sequence[Mapping[str, Any]]],
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
        n = self.config.n
        group_ids = self._group_ids(rows, group_ids)
        done = set(skip)
        shared = self._shared((r.ground_truth for r in rows), sampling=sampling)
        results: list[Trajectory | None] = [None] * (len(rows) * n)

        async def one(prompt_index: int, sample_index: int) -> None:
            trajectory = await self._run_one(
                shared, rows[prompt_index], prompt_index, sample_index, group_ids[prompt_index]
            )
            results[prompt_index * n + sample_index] = trajectory
            if on_result is not None:
                on_result(trajectory)

        keys = [(p, s) for p in range(len(rows)) for s in range(n) if (p, s) not in done]

        def prepare(batch: Sequence[tuple[Any, ...]]) -> None:
            prerender_prompts(shared, (rows[p].messages for p, _ in batch))

        async with _admission_watch(shared), anyio.create_task_group() as tg:
            await _start_in_batches(tg, one, keys, prepare)
        return [t for t in results if t is not None]

    async def _run_one(
        self,
        shared: RolloutShared,
        prompt: RolloutPrompt,
        prompt_index: int,
        sample_index: int,
        group_id: str,
        resume: ResumePoint | None = None,
    ) -> Trajectory:
        """One sample, always to a row: the loop's own faults, bugs and the deadline."""
        timeout = self.config.trajectory_timeout
        reason = "timeout"
        error = f"TrajectoryTimeout: not finished within trajectory_timeout={timeout} s"
        # No deadline, no cancel scope: a scope and its two sets are about 0.7 KB that
        # each of 10,000 live trajectories would hold for nothing (docs/benchmarks.md).
        deadline = anyio.move_on_after(timeout) if timeout is not None else nullcontext()
        trajectory: Trajectory | None = None
        try:
            with deadline:
                trajectory = await run_trajectory(
                    shared,
                    prompt,
                    prompt_index=prompt_index,
                    sample_index=sample_index,
                    group_id=group_id,
                    resume=resume,
                    hooks=self.hooks,
                )
        except Exception as exc:  # a bug in one trajectory must not end the batch
            reason, error = "error", f"{type(exc).__name__}: {exc}"
        if trajectory is None:
            trajectory = failed_trajectory(
                group_id=group_id,
                prompt_index=prompt_index,
                sample_index=sample_index,
                prompt=prompt,
                reason=reason,
                error=error,
            )
        if self._logprob_label is None:
            return trajectory
        return replace(
            trajectory, metrics={**trajectory.metrics, "logprob_mismatch": self._logprob_label}
        )

    @_opens_tools
    async def run_batch(
        self,
        prompts: Sequence[RolloutPrompt | Mapping[str, Any] | Sequence[Mapping[str, Any]]],
        *,
        target_groups: int,
        keep_groups_whole: bool = True,
        on_result: Callable[[Trajectory], None] | None = None,
        group_ids: Sequence[str] | None = None,
        skip: Collection[tuple[int, int]] = (),
        until: anyio.Event | None = None,
    ) -> RolloutBatch:
        """Oversampling: run every prompt's group, stop at ``target_groups`` complete groups.

        Pass more prompts than ``target_groups`` (the oversampling). Once the target is
        met no trajectory starts another engine request, the requests in flight are
        aborted on the server by rid (their partial output comes back), and tool calls
        still running are cancelled (``RolloutConfig.tools_at_target="finish"`` lets them
        end instead). Nothing is left running when this returns. ``on_result``
        sees every trajectory, aborted ones included.

        ``skip`` lists (prompt_index, sample_index) pairs not to run here (as in
        :meth:`run`; the target counts the groups left). ``until`` is a stop from outside
        (a target shared with other processes): once set, the batch stops as if its
        target were met, and holds the groups complete by then.
        """
        rows = self._check_rows(prompts)
        done = set(skip)
        launched = {p for p in range(len(rows)) for s in range(self.config.n) if (p, s) not in done}
        if not 1 <= target_groups <= len(launched):
            raise UserError(
                f"target_groups must be between 1 and the {len(launched)} prompts run, "
                f"got {target_groups}"
            )
        group_ids = self._group_ids(rows, group_ids)
        stop = StopControl()
        shared = self._shared((r.ground_truth for r in rows), stop)
        jobs = [
            _Job(
                group_ids[p],
                p,
                s,
                functools.partial(self._run_one, shared, rows[p], p, s, group_ids[p]),
                prompt=rows[p],
            )
            for p in range(len(rows))
            for s in range(self.config.n)
            if (p, s) not in done
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

        Each ``aborted`` one goes on from its prompt plus partial output, token for token:
        its model tokens keep mask 1 and their original logprobs, and an open turn is
        continued, not restarted. Finished ones pass through unchanged and count for their
        group. Without ``target_groups`` everything runs to the end; with it, this is a new
        oversampled batch (see :meth:`run_batch`). Tool and interaction instances are new:
        a stateful tool's state from before the abort is not carried over. ``on_result``
        sees only the trajectories that were run.
        """
        stop = StopControl()
        shared = self._shared((t.ground_truth for t in trajectories), stop)
        jobs: list[_Job] = []
        for trajectory in trajectories:
            job = _Job(trajectory.group_id, trajectory.prompt_index, trajectory.sample_index, None)
            point = trajectory.resume_point
            if trajectory.status is not TrajectoryStatus.ABORTED:
                job.done = trajectory
            elif point is None:
                raise UserError(
                    f"trajectory {trajectory.uid} is aborted but has no resume point "
                    "(resume points live in memory; rows read back from files have none)"
                )
            else:
                job.run = functools.partial(
                    self._run_one,
                    shared,
                    resume_prompt(point),
                    trajectory.prompt_index,
                    trajectory.sample_index,
                    trajectory.group_id,
                    point,
                )
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
        jobs: Sequence[_Job],
        stop: StopControl,
        target_groups: int,
        keep_groups_whole: bool,
        on_result: Callable[[Trajectory], None] | None,
        until: anyio.Event | None = None,
    ) -> RolloutBatch:
        """Run the jobs until the target is met, then abort the rest and wait for them."""
        cancel_tools = self.config.tools_at_target == "cancel"
        tally = _Tally(self.config.n, target_groups, keep_groups_whole)
        pending = sum(1 for job in jobs if job.done is None)
        all_ended = anyio.Event()
        wake = anyio.Event()
        """Set when the target is met or nothing is left running."""

        def record(job: _Job, trajectory: Trajectory) -> None:
            if tally.record(job, trajectory, stopping=stop.stopping):
                stop.stop(cancel_tools=cancel_tools)
                wake.set()

        for job in jobs:
            if job.done is not None:
                record(job, job.done)
        if pending == 0:
            all_ended.set()
            wake.set()
        outside = anyio.CancelScope()

        async def stop_from_outside(event: anyio.Event) -> None:
            with outside:
                await event.wait()
                stop.stop(cancel_tools=cancel_tools)
                wake.set()

        async def one(job: _Job) -> None:
            nonlocal pending
            assert job.run is not None
            try:
                trajectory = await job.run()
                record(job, trajectory)
                if on_result is not None:
                    on_result(trajectory)
            finally:
                pending -= 1
                if pending == 0:
                    all_ended.set()
                    wake.set()
                    outside.cancel()

        async with _admission_watch(shared), anyio.create_task_group() as tg:
            tg.start_soon(self._abort_stragglers, stop, wake, all_ended)
            if until is not None and pending:
                tg.start_soon(stop_from_outside, until)
            await _start_in_batches(
                tg,
                one,
                [(job,) for job in jobs if job.done is None],
                lambda batch: prerender_prompts(
                    shared, (job.prompt.messages for (job,) in batch if job.prompt is not None)
                ),
            )
        return tally.rollout_batch()

    async def _abort_stragglers(
        self, stop: StopControl, wake: anyio.Event, all_ended: anyio.Event
    ) -> None:
        """Once the target is met, abort every request still in flight (again, until none is).

        Runs inside the batch's task group and ends with it: no abort outlives the call.
        """
        await wake.wait()
        while not all_ended.is_set():
            rids = list(stop.inflight)
            if rids:
                async with anyio.create_task_group() as tg:
                    for rid in rids:
                        tg.start_soon(self._abort_one, rid)
            with anyio.move_on_after(ABORT_RESEND_SECONDS):
                await all_ended.wait()

    async def _abort_one(self, rid: str) -> None:
        try:
            await self.engine.abort(rid)
        except EngineError as exc:  # its request ends anyway; the batch is not lost for it
            logger.warning("straggler abort of %s failed: %s", rid, exc)

    def run_sync(
        self,
        prompts: Sequence[RolloutPrompt | Mapping[str, Any] | Sequence[Mapping[str, Any]]],
        **kwargs: Any,
    ) -> list[Trajectory]:
        """Blocking wrapper around :meth:`run` for scripts and sync trainers."""

        async def main() -> list[Trajectory]:
            return await self.run(prompts, **kwargs)

        return anyio.run(main)
