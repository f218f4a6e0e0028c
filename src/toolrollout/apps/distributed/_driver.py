"""The Ray driver behind ``toolrollout generate --ray`` (docs/scale-out.md).

The driver shards the prompts (whole GRPO groups per shard), starts one Ray actor per
shard, and collects what each returns into the run's crash-safe shard folder, which the
caller merges exactly as in a one-machine run. With ``--target-groups`` a
:class:`~toolrollout.apps.distributed.BatchCoordinator` actor counts finished groups over
all shards and stops every worker once the target is met. Every actor talks to the same
engine servers (``_engines.py``). Ray is imported only inside :func:`run_sharded`.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from toolrollout._exceptions import DistributedError, UserError
from toolrollout.rollout import RolloutPrompt, ShardWriter, Trajectory, done_samples
from toolrollout.rollout._runner import failed_trajectory
from toolrollout.spec import RunSpec
from toolrollout.spec._spec import check_target_groups

from ._batch import BatchCoordinator
from ._engines import RunEngines, run_engines
from ._sharding import shard_prompts
from ._worker import ShardJob, ShardResult, ShardWorker

__all__ = ["RayOptions", "RayRunReport", "import_ray", "run_sharded"]

_SPILL_PREFIX = "worker-"


@dataclass(frozen=True)
class RayOptions:
    """Where and how wide to run: ``address`` joins a running cluster (``None`` starts a
    local one sized for the workers); each worker actor reserves ``cpus_per_worker``."""

    workers: int = 2
    address: str | None = None
    cpus_per_worker: float = 1.0

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise UserError(f"--ray-workers must be at least 1, got {self.workers}")


@dataclass(frozen=True)
class RayRunReport:
    """What a sharded run did: the rows it got, and each shard's fate.

    ``failures`` has one line per shard whose worker died or raised, naming the shard;
    its samples are in the output all the same (rows the worker had already written to a
    reachable shard folder, the rest as ``failed`` rows carrying that line).
    """

    trajectories: tuple[Trajectory, ...]
    rows_written: int
    seconds: float = 0.0
    shards: tuple[dict[str, Any], ...] = ()
    failures: tuple[str, ...] = ()
    interrupted: str | None = None
    engine_urls: tuple[str, ...] = ()
    resumed: int = 0  # samples that already had a row (--resume), worker folders included
    rows_on_disk: int = 0  # samples with a row in the shard folder, worker folders included
    leftover: tuple[Trajectory, ...] = ()
    """With a batch target: every trajectory not in the batch (aborted ones resumable)."""


def import_ray() -> Any:
    """The ``ray`` module, or a one-line :class:`UserError` saying how to install it."""
    try:
        import ray
    except ImportError:
        raise UserError("--ray needs Ray: pip install 'toolrollout[ray]'") from None
    return ray


def run_sharded(
    prompts: Sequence[RolloutPrompt],
    *,
    spec: RunSpec,
    group_ids: Sequence[str],
    parts: Path,
    options: RayOptions,
    skip: frozenset[tuple[int, int]] = frozenset(),
    run_id: str = "run",
) -> RayRunReport:
    """Roll out ``prompts`` as ``spec`` says over ``options.workers`` Ray actors into the
    shard folder ``parts``.

    Each actor builds its runner from ``spec`` (with :func:`~toolrollout.spec.open_run`),
    writes its own crash-safe shards under ``parts/worker-NNN/`` and returns its rows,
    which the driver writes into ``parts``. With ``spec.resume``, rows left in those worker
    folders by an interrupted run are taken over first and not run again. Without
    ``spec.engine_urls`` one shared ``toolrollout serve`` on ``spec.model_path`` serves
    every actor. ``spec.rewards`` should be explicit (``"auto"`` would see no ground truths
    on the workers: :meth:`~toolrollout.spec.RunSpec.rewards_for` picks them first).

    With ``spec.target_groups`` the run is one batch over all shards (straggler control):
    every shard stops once that many groups are complete anywhere, only the batch is
    written to ``parts``, and the report's ``leftover`` holds the rest (nothing is
    spilled, so ``resume`` does not apply).
    """
    ray = import_ray()
    target_groups, resume = spec.target_groups, spec.resume
    if target_groups is not None:
        check_target_groups(target_groups, len(prompts))
    spills = sorted(parts.glob(f"{_SPILL_PREFIX}*"))
    if resume:
        for spill in spills:
            skip = skip | _adopt(spill, parts)
    elif any(any(d.glob("part-*.parquet")) for d in spills):
        raise UserError(
            f"{parts} holds an unfinished Ray run: pass --resume to complete it, or delete it"
        )
    spec = _portable(spec)
    started = time.perf_counter()
    owns_ray = not ray.is_initialized()
    try:
        with run_engines(ray, spec, options.address) as engine:
            if spec.engine_urls:
                engine.ready()  # a wrong --engine-url fails before Ray starts
            if owns_ray:  # a shared server started here loads its model meanwhile
                _init_ray(ray, options)
            urls = engine.urls
            shard_spec = spec.replace(engine_urls=tuple(urls), engine_api_key=engine.api_key)
            jobs = [
                ShardJob(
                    shard=shard,
                    prompt_indices=indices,
                    spec=shard_spec,
                    spill_dir=str((parts / f"{_SPILL_PREFIX}{shard:03d}").resolve()),
                )
                for shard, indices in enumerate(shard_prompts(len(prompts), options.workers))
            ]
            target = None if target_groups is None else (target_groups, spec.keep_groups_whole)
            report = _drive(
                ray, jobs, prompts, group_ids, skip, parts, options, run_id, engine, target
            )
    finally:
        if owns_ray and ray.is_initialized():
            ray.shutdown()
    on_disk = done_samples(parts)
    for spill in parts.glob(f"{_SPILL_PREFIX}*"):
        on_disk |= done_samples(spill)
    return replace(
        report,
        seconds=time.perf_counter() - started,
        engine_urls=tuple(urls),
        resumed=len(skip),
        rows_on_disk=len(on_disk),
    )


def _init_ray(ray: Any, options: RayOptions) -> None:
    # Ray's opt-out usage reporting stays off unless the user turned it on themselves.
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    settings: dict[str, Any] = {
        "namespace": "toolrollout",
        "log_to_driver": False,
        "logging_level": "ERROR",
    }
    where = f" at {options.address}" if options.address else ""
    try:
        if options.address:
            ray.init(address=options.address, **settings)
        else:
            cpus = max(options.workers * options.cpus_per_worker, 1.0)
            ray.init(num_cpus=int(cpus + 0.999), include_dashboard=False, **settings)
    except Exception as exc:  # ray raises ConnectionError, RuntimeError, ValueError...
        raise DistributedError(f"cannot start or join the Ray cluster{where}: {exc}") from exc


def _portable(spec: RunSpec) -> RunSpec:
    """``spec`` with absolute paths, the same on every node of a shared filesystem."""
    return spec.replace(
        model=spec.model_path.resolve(),
        tool_config=spec.tool_config.resolve() if spec.tool_config else None,
        interaction_config=(spec.interaction_config.resolve() if spec.interaction_config else None),
    )


def _shard_row(result: ShardResult) -> dict[str, Any]:
    """A finished shard as the run's report lists it."""
    return {
        "shard": result.shard,
        "node": result.node,
        "host": result.host,
        "rows": len(result.trajectories),
        "seconds": result.seconds,
    }


def _coordinator(ray: Any, jobs: list[ShardJob], run_id: str, target: tuple[int, bool]) -> Any:
    """The actor that counts one batch over all shards, started and ready for reports."""
    n = jobs[0].spec.config.n if jobs else 1
    coordinator = (
        ray.remote(num_cpus=0, max_restarts=0)(BatchCoordinator)
        .options(name=f"toolrollout-{run_id}-batch")
        .remote(target[0], n, target[1])
    )
    # Wait until the count can be reached: a shard whose reports queue behind a
    # coordinator that is still starting would run its whole shard past the target.
    ray.get(coordinator.stopped.remote())
    return coordinator


def _drive(
    ray: Any,
    jobs: list[ShardJob],
    prompts: Sequence[RolloutPrompt],
    group_ids: Sequence[str],
    skip: frozenset[tuple[int, int]],
    parts: Path,
    options: RayOptions,
    run_id: str,
    engine: RunEngines,
    target: tuple[int, bool] | None = None,
) -> RayRunReport:
    """Start the actors, gather their results as they finish, account for every sample.

    ``target`` (target_groups, keep_groups_whole): one batch over all shards, counted by a
    coordinator actor; the rows are written once every shard has stopped."""
    remote = ray.remote(num_cpus=options.cpus_per_worker, max_restarts=0)(ShardWorker)
    coordinator = None if target is None else _coordinator(ray, jobs, run_id, target)
    actors = [
        remote.options(
            name=f"toolrollout-{run_id}-shard-{job.shard}",
            scheduling_strategy="SPREAD",  # one actor per node while nodes last
        ).remote()
        for job in jobs
    ]
    shared = (ray.put(list(prompts)), ray.put(list(group_ids)), ray.put(frozenset(skip)))
    pending = {
        actor.run.remote(job, *shared, coordinator=coordinator): job
        for actor, job in zip(actors, jobs, strict=True)
    }
    rows: list[Trajectory] = []
    shards: list[dict[str, Any]] = []
    failed: list[tuple[ShardJob, str]] = []
    interrupted: str | None = None
    writer = ShardWriter(parts)
    try:
        # The actors start up (imports, tokenizer) while a shared server loads its model;
        # they wait for its health themselves (a started one is restarted if it dies).
        engine.ready()
        with writer:
            while pending:
                [ref], _ = ray.wait(list(pending), num_returns=1)
                job = pending.pop(ref)
                try:
                    result: ShardResult = ray.get(ref)
                except ray.exceptions.RayError as exc:
                    failed.append((job, _describe(job, exc)))
                    continue
                if coordinator is None:  # a batch is written once all shards are in
                    for trajectory in result.trajectories:
                        writer.write(trajectory)
                rows.extend(result.trajectories)
                shards.append(_shard_row(result))
        if coordinator is not None:
            chosen = set(ray.get(coordinator.chosen.remote()))
            return _split_batch(rows, chosen, failed, prompts, group_ids, parts, shards)
    except KeyboardInterrupt:
        interrupted = "SIGINT"
    finally:
        for actor in actors:
            ray.kill(actor)
        if coordinator is not None:
            ray.kill(coordinator)
    written = writer.rows_written
    if coordinator is not None:  # interrupted: a batch run writes nothing
        failures = tuple(m for _, m in failed)
        return RayRunReport((), 0, shards=tuple(shards), failures=failures, interrupted=interrupted)
    if interrupted is None:
        rows_failed, adopted = _account_for_failures(failed, prompts, group_ids, skip, parts)
        rows.extend(rows_failed)
        written += len(rows_failed) + adopted
    return RayRunReport(
        trajectories=tuple(rows),
        rows_written=written,
        shards=tuple(sorted(shards, key=lambda s: int(s["shard"]))),
        failures=tuple(message for _, message in failed),
        interrupted=interrupted,
    )


def _lost_samples(
    failed: list[tuple[ShardJob, str]],
    prompts: Sequence[RolloutPrompt],
    group_ids: Sequence[str],
    have: frozenset[tuple[int, int]] = frozenset(),
) -> list[Trajectory]:
    """A ``failed`` row for each sample of a failed shard not in ``have`` (its worker died
    before returning it)."""
    return [
        failed_trajectory(
            group_id=group_ids[p],
            prompt_index=p,
            sample_index=s,
            prompt=prompts[p],
            reason="error",
            error=f"DistributedError: {message}",
        )
        for job, message in failed
        for p in job.prompt_indices
        for s in range(job.spec.config.n)
        if (p, s) not in have
    ]


def _split_batch(
    rows: list[Trajectory],
    chosen: set[tuple[str, int]],
    failed: list[tuple[ShardJob, str]],
    prompts: Sequence[RolloutPrompt],
    group_ids: Sequence[str],
    parts: Path,
    shards: list[dict[str, Any]],
) -> RayRunReport:
    """Write the coordinator's batch into ``parts``; everything else is the leftover.

    A dead shard's samples come back as ``failed`` rows in the leftover (its rows never
    reach the driver, so a group it had finished is missing from the batch; the failure
    line says which shard).
    """
    lost = _lost_samples(failed, prompts, group_ids)
    ordered = sorted(rows + lost, key=lambda t: (t.prompt_index, t.sample_index))
    batch = [t for t in ordered if (t.group_id, t.sample_index) in chosen]
    with ShardWriter(parts) as writer:
        for trajectory in batch:
            writer.write(trajectory)
    return RayRunReport(
        trajectories=tuple(batch),
        rows_written=len(batch),
        shards=tuple(sorted(shards, key=lambda s: int(s["shard"]))),
        failures=tuple(message for _, message in failed),
        interrupted=None,
        leftover=tuple(t for t in ordered if (t.group_id, t.sample_index) not in chosen),
    )


def _describe(job: ShardJob, exc: BaseException) -> str:
    """One line naming the shard and what killed it (a worker's own error, or its death)."""
    cause = getattr(exc, "cause", None) or exc
    text = str(cause).strip().splitlines()
    detail = f"{type(cause).__name__}: {text[0] if text else ''}".rstrip(": ")
    indices = job.prompt_indices
    shown = ",".join(str(i) for i in indices[:4])
    shown = f"{shown},..." if len(indices) > 4 else shown or "none"
    return f"ray shard {job.shard} (prompts {shown}) failed: {detail}"


def _account_for_failures(
    failed: list[tuple[ShardJob, str]],
    prompts: Sequence[RolloutPrompt],
    group_ids: Sequence[str],
    skip: frozenset[tuple[int, int]],
    parts: Path,
) -> tuple[list[Trajectory], int]:
    """Keep what failed workers had written; a ``failed`` row for each sample still missing."""
    adopted: set[tuple[int, int]] = set()
    for job, _ in failed:
        adopted |= _adopt(Path(job.spill_dir), parts)
    rows = _lost_samples(failed, prompts, group_ids, skip | adopted)
    if rows:
        with ShardWriter(parts) as writer:
            for row in rows:
                writer.write(row)
    return rows, len(adopted)


def _adopt(spill: Path, parts: Path) -> set[tuple[int, int]]:
    """Move a worker folder's whole shards into ``parts`` (numbered after its own)."""
    if not spill.is_dir():
        return set()  # on another node's disk: those rows are gone with the worker
    pairs = done_samples(spill)
    taken = [int(p.stem.split("-")[1]) for p in parts.glob("part-*.parquet")]
    number = max(taken, default=-1) + 1
    for shard in sorted(spill.glob("part-*.parquet")):
        target = parts / f"part-{number:06d}.parquet"
        shutil.move(str(shard), target)
        number += 1
    shutil.rmtree(spill, ignore_errors=True)
    return pairs
