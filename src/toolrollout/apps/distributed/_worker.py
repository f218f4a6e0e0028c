"""One Ray rollout worker: the ordinary async rollout loop over one shard of the prompts.

Plain Python: the driver wraps it with ``ray.remote``, so this module never imports Ray.
A worker builds its runner from the picklable :class:`ShardJob` with
:func:`~toolrollout.spec.open_run`, as a one-machine run does (live tool clients do not pickle).
"""

from __future__ import annotations

import math
import socket
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from toolrollout.rollout import RolloutPrompt, Trajectory, TrajectoryStatus
from toolrollout.spec import RunSpec

__all__ = ["ShardJob", "ShardResult", "ShardWorker"]

POLL_SECONDS = 0.2
"""How often a worker in a sharded batch asks whether another shard met the target."""


@dataclass(frozen=True)
class ShardJob:
    """What one worker runs: its prompt indices and the run's specification.

    ``spec.engine_urls`` are the servers every shard shares. Paths in ``spec`` (model or
    tokenizer folder, tool and interaction configs) must be readable at the same place on
    every node: ship them on a shared filesystem or in the image. With a batch target
    (``spec.target_groups``) the shard stops when the shared coordinator says so and
    returns every trajectory (aborted ones with their resume points); nothing is spilled.
    """

    shard: int
    prompt_indices: tuple[int, ...]
    spec: RunSpec
    spill_dir: str


@dataclass(frozen=True)
class ShardResult:
    """A finished shard: its rows (tagged with the shard and node) and where it ran."""

    shard: int
    node: str
    host: str
    seconds: float
    trajectories: tuple[Trajectory, ...]


def _node_id() -> str:
    """The Ray node id when running inside Ray, else the host name (plain-Python use)."""
    try:
        import ray

        if ray.is_initialized():
            return str(ray.get_runtime_context().get_node_id())
    except ImportError:
        pass
    return socket.gethostname()


def _spill_dir(wanted: str) -> Path:
    """The shard folder the driver asked for, or a private temp folder when that path
    cannot be created on this node (no shared filesystem); the rows still come back."""
    path = Path(wanted)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return Path(tempfile.mkdtemp(prefix="toolrollout-shard-"))
    return path


class ShardWorker:
    """Rolls out one shard against the shared engine servers and writes its own shards.

    Each finished trajectory is written at once to crash-safe parquet shards in the
    job's ``spill_dir`` (the same :class:`~toolrollout.rollout.ShardWriter` as a
    single-machine run), and all of them are returned to the driver at the end.
    """

    async def run(
        self,
        job: ShardJob,
        prompts: Sequence[RolloutPrompt],
        group_ids: Sequence[str],
        skip: frozenset[tuple[int, int]] = frozenset(),
        coordinator: Any = None,
    ) -> ShardResult:
        """Roll out the shard; with a batch target, ``coordinator`` is the handle of the
        run's :class:`~toolrollout.apps.distributed.BatchCoordinator` actor."""
        # async: Ray runs it on the actor's own event loop (an async actor), where the
        # rollout's anyio task groups run as they do in a one-machine run.
        from toolrollout.rollout import ShardWriter
        from toolrollout.spec import open_run

        started = time.perf_counter()
        node = _node_id()
        spill = _spill_dir(job.spill_dir)
        rows: list[Trajectory] = []
        mine = set(job.prompt_indices)
        n = job.spec.config.n
        # The runner sees the whole prompt list and skips other shards' samples, so prompt
        # indices, group ids and per-sample seeds are exactly those of a one-machine run.
        others = {(p, s) for p in range(len(prompts)) if p not in mine for s in range(n)}
        tag = {"ray_shard": job.shard, "ray_node": node}
        async with open_run(job.spec) as run:
            runner = run.runner
            if job.spec.batch:
                await _run_batch(job, runner, prompts, group_ids, others, tag, rows, coordinator)
            else:
                with ShardWriter(spill, rows_per_shard=job.spec.flush_every) as writer:

                    def on_result(trajectory: Trajectory) -> None:
                        tagged = replace(trajectory, metrics={**trajectory.metrics, **tag})
                        writer.write(tagged)
                        rows.append(tagged)

                    await runner.run(
                        prompts, on_result=on_result, group_ids=group_ids, skip=others | set(skip)
                    )
        return ShardResult(
            shard=job.shard,
            node=node,
            host=socket.gethostname(),
            seconds=time.perf_counter() - started,
            trajectories=tuple(rows),
        )


async def _run_batch(
    job: ShardJob,
    runner: Any,
    prompts: Sequence[RolloutPrompt],
    group_ids: Sequence[str],
    others: set[tuple[int, int]],
    tag: dict[str, Any],
    rows: list[Trajectory],
    coordinator: Any,
) -> None:
    """This shard's part of a batch whose target is shared by all shards.

    Finished samples go to the coordinator as they come (one reporting task, draining a
    stream); another task polls it for a stop met elsewhere. Either sets ``until``, which
    stops the runner's batch: its in-flight requests are aborted on the servers and the
    cut-short trajectories keep their resume points. Both tasks end with the batch.
    """
    import anyio

    if coordinator is None:
        raise ValueError("a batch shard needs its coordinator")
    until = anyio.Event()
    send, receive = anyio.create_memory_object_stream[tuple[str, int]](math.inf)

    def on_result(trajectory: Trajectory) -> None:
        rows.append(replace(trajectory, metrics={**trajectory.metrics, **tag}))
        if trajectory.status is not TrajectoryStatus.ABORTED:
            send.send_nowait((trajectory.group_id, trajectory.sample_index))

    async def report() -> None:
        async with receive:
            async for key in receive:
                keys = [key]
                while True:
                    try:
                        keys.append(receive.receive_nowait())
                    except (anyio.WouldBlock, anyio.EndOfStream):
                        break
                if await coordinator.report.remote(keys):
                    until.set()

    async def poll() -> None:
        while not until.is_set():
            if await coordinator.stopped.remote():
                until.set()
            await anyio.sleep(POLL_SECONDS)

    mine = {
        p for p in range(len(prompts)) for s in range(job.spec.config.n) if (p, s) not in others
    }
    async with anyio.create_task_group() as tg:
        tg.start_soon(report)
        polling = anyio.CancelScope()

        async def poll_until_done() -> None:
            with polling:
                await poll()

        tg.start_soon(poll_until_done)
        async with send:  # closed when the batch ends: the reporter drains it, then ends
            if mine:
                await runner.run_batch(
                    prompts,
                    target_groups=len(mine),  # run all; the stop comes from the coordinator
                    keep_groups_whole=job.spec.keep_groups_whole,
                    on_result=on_result,
                    group_ids=group_ids,
                    skip=others,
                    until=until,
                )
        polling.cancel()
