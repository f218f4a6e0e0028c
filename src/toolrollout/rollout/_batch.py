"""A batch with a target (oversampling): its jobs, the tally that says when the target is
met, and the stop (requests in flight aborted by rid until none is). Also how a run starts
its trajectories: :data:`START_BATCH` at a time, under the scheduler's loop-lag probe.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel

from toolrollout._exceptions import UserError
from toolrollout._records import ResumePoint, RolloutPrompt, Trajectory, TrajectoryStatus

from ._hooks import TrajectoryHooks
from ._loop import run_trajectory
from ._types import RolloutShared, StopControl, prerender_prompts

__all__ = [
    "ABORT_RESEND_SECONDS",
    "START_BATCH",
    "Job",
    "RolloutBatch",
    "Tally",
    "admission_watch",
    "failed_trajectory",
    "gather",
    "group_ids_for",
    "run_sample",
    "start_in_batches",
]

START_BATCH = 64
"""Trajectories started per turn of the event loop. Each renders its prompt before its
first request, synchronously; started all at once, 10,000 of them blocked the loop for
100 s (docs/benchmarks.md). In batches, the loop serves replies and timers between them."""
ABORT_RESEND_SECONDS = 1.0
"""An abort that reaches SGLang before the request is registered there is dropped, so the
runner names every rid still in flight again after this many seconds."""


def admission_watch(shared: RolloutShared) -> AbstractAsyncContextManager[object]:
    """The scheduler's loop-lag probe (the ``lag`` policy) for as long as the block runs."""
    scheduler = shared.scheduler
    return nullcontext() if scheduler is None else scheduler.watching(shared.engine_limiter)


async def start_in_batches(
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


@dataclass(slots=True)
class Job:
    """One sample to run (or, with ``done``, one already finished and passed through)."""

    group_id: str
    prompt_index: int
    sample_index: int
    run: Callable[[], Awaitable[Trajectory]] | None
    done: Trajectory | None = None
    prompt: RolloutPrompt | None = None
    """A fresh sample's prompt (rendered with its start batch); ``None`` when resumed."""


@dataclass(slots=True)
class Tally:
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

    def record(self, job: Job, trajectory: Trajectory, *, stopping: bool) -> bool:
        """Keep ``job``'s trajectory; True when it is the one that meets the target."""
        key = (job.group_id, job.sample_index)
        self.results[key] = trajectory
        if stopping or trajectory.status is TrajectoryStatus.ABORTED:
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


def failed_trajectory(
    *,
    group_id: str,
    prompt_index: int,
    sample_index: int,
    prompt: RolloutPrompt,
    reason: str,
    error: str,
) -> Trajectory:
    """The row of a sample whose rollout could not even produce a partial transcript:
    flagged ``failed`` with the error, so a trainer drops it instead of reading a 0 reward."""
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


def group_ids_for(rows: Sequence[RolloutPrompt], group_ids: Sequence[str] | None) -> list[str]:
    """The given group ids (one per row), or fresh ones: ``<batch>-p<index>``."""
    if group_ids is None:
        batch = uuid.uuid4().hex[:8]
        return [f"{batch}-p{i}" for i in range(len(rows))]
    if len(group_ids) != len(rows):
        raise UserError(f"got {len(group_ids)} group_ids for {len(rows)} prompts")
    return list(group_ids)


async def run_sample(
    shared: RolloutShared,
    prompt: RolloutPrompt,
    place: tuple[str, int, int],
    resume: ResumePoint | None,
    *,
    hooks: TrajectoryHooks,
    logprob_label: str | None,
) -> Trajectory:
    """One sample, always to a row: the loop's own faults, bugs and the deadline
    (``trajectory_timeout``) each give a ``failed`` one with the error. A
    ``logprob_label`` is the engine's reason its logprobs are inexact, kept in every
    row's metrics."""
    group_id, prompt_index, sample_index = place
    timeout = shared.config.trajectory_timeout
    reason = "timeout"
    error = f"TrajectoryTimeout: not finished within trajectory_timeout={timeout} s"
    # No deadline, no cancel scope: a scope and its two sets are about 0.7 KB that
    # each of 10,000 live trajectories would hold for nothing (docs/benchmarks.md).
    deadline = anyio.move_on_after(timeout) if timeout is not None else nullcontext()
    trajectory: Trajectory | None = None
    try:
        with deadline:
            trajectory = await run_trajectory(shared, prompt, place, resume, hooks)
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
    if logprob_label is None:
        return trajectory
    return replace(trajectory, metrics={**trajectory.metrics, "logprob_mismatch": logprob_label})


async def gather(
    shared: RolloutShared,
    jobs: Sequence[Job],
    stop: StopControl,
    tally: Tally,
    *,
    cancel_tools: bool,
    abort: Callable[[str], Coroutine[Any, Any, None]],
    on_result: Callable[[Trajectory], None] | None,
    until: anyio.Event | None = None,
) -> RolloutBatch:
    """Run the jobs until ``tally``'s target is met, then stop the rest (``abort`` each
    request still in flight, by rid) and wait for them."""
    pending = sum(1 for job in jobs if job.done is None)
    all_ended = anyio.Event()
    wake = anyio.Event()
    """Set when the target is met or nothing is left running."""

    def stop_now() -> None:
        stop.stop(cancel_tools=cancel_tools)
        wake.set()

    def record(job: Job, trajectory: Trajectory) -> None:
        if tally.record(job, trajectory, stopping=stop.stopping):
            stop_now()

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
            stop_now()

    async def one(job: Job) -> None:
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

    async with admission_watch(shared), anyio.create_task_group() as tg:
        tg.start_soon(_abort_stragglers, abort, stop, wake, all_ended)
        if until is not None and pending:
            tg.start_soon(stop_from_outside, until)
        await start_in_batches(
            tg,
            one,
            [(job,) for job in jobs if job.done is None],
            lambda batch: prerender_prompts(
                shared, (job.prompt.messages for (job,) in batch if job.prompt is not None)
            ),
        )
    return tally.rollout_batch()


async def _abort_stragglers(
    abort: Callable[[str], Coroutine[Any, Any, None]],
    stop: StopControl,
    wake: anyio.Event,
    all_ended: anyio.Event,
) -> None:
    """Once the target is met, abort every request still in flight (again, until none is),
    inside the batch's task group: no abort outlives the call."""
    await wake.wait()
    while not all_ended.is_set():
        rids = list(stop.inflight)
        if rids:
            async with anyio.create_task_group() as tg:
                for rid in rids:
                    tg.start_soon(abort, rid)
        with anyio.move_on_after(ABORT_RESEND_SECONDS):
            await all_ended.wait()
