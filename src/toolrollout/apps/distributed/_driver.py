"""The Ray driver behind ``toolrollout generate --ray``.

The driver shards the prompts (whole GRPO groups per shard), starts one Ray actor per
shard, and collects what each returns into the run's crash-safe shard folder; the caller
then merges that folder exactly as in a one-machine run (rows ordered by prompt, then
sample). Ray is imported only here, inside :func:`run_sharded`.

With a batch target (``--target-groups``) one more small actor, a
:class:`~toolrollout.apps.distributed.BatchCoordinator`, counts finished groups over all shards
and tells every worker to stop once the target is met (see ``_batch.py``); the driver then
writes the batch and hands back the rest as the run's leftover.

Every actor talks to the same engine servers. Without ``engine_urls`` the driver starts one
shared ``toolrollout serve`` on its own node for the whole run (never one engine per actor:
a model copy per actor would multiply memory and split the batching). That server requires
a random API key made for the run (``secrets.token_urlsafe``), handed to the server in its
environment (never on its command line) and to the workers in their
:class:`~toolrollout.spec.RunSpec`: on a cluster it listens on every interface, and only
the run's own workers can use it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import anyio
import httpx
from anyio.from_thread import start_blocking_portal

from toolrollout._exceptions import DistributedError, UserError
from toolrollout._security import ADMIN_API_KEY_ENV, API_KEY_ENV
from toolrollout._supervisor import RestartPolicy, ServiceCommand, SupervisedService, supervise
from toolrollout.engines._factory import EngineKind
from toolrollout.rollout import RolloutPrompt, ShardWriter, Trajectory, done_samples
from toolrollout.rollout._runner import failed_trajectory
from toolrollout.spec import RunSpec
from toolrollout.spec._spec import check_target_groups

from ._batch import BatchCoordinator
from ._sharding import shard_prompts
from ._worker import ShardJob, ShardResult, ShardWorker

__all__ = ["RayOptions", "RayRunReport", "import_ray", "run_sharded"]

_INSTALL_HINT = "--ray needs Ray: pip install 'toolrollout[ray]'"
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
    seconds: float
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
        raise UserError(_INSTALL_HINT) from None
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
        skip = skip | _adopt_all(spills, parts)
    elif any(any(d.glob("part-*.parquet")) for d in spills):
        raise UserError(
            f"{parts} holds an unfinished Ray run: pass --resume to complete it, or delete it"
        )
    spec = _portable(spec)
    started = time.perf_counter()
    owns_ray = not ray.is_initialized()
    try:
        with _engine(ray, spec, options) as engine:
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
    return RayRunReport(
        trajectories=report.trajectories,
        rows_written=report.rows_written,
        seconds=time.perf_counter() - started,
        shards=report.shards,
        failures=report.failures,
        interrupted=report.interrupted,
        engine_urls=tuple(urls),
        resumed=len(skip),
        rows_on_disk=len(on_disk),
        leftover=report.leftover,
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


class _Engines:
    """The engine URLs of a run; :meth:`ready` waits until they answer (a server the
    driver started, or the given ones: a wrong ``--engine-url`` is then one clear error,
    as without ``--ray``, instead of a failed row per sample)."""

    def __init__(
        self,
        urls: list[str],
        timeout: float,
        served: _ServedEngine | None = None,
        api_key: str | None = None,
        engine: EngineKind = "auto",
    ):
        self.urls, self._timeout, self._served = urls, timeout, served
        self.api_key, self.engine = api_key, engine

    def ready(self) -> list[str]:
        if self._served is not None:
            self._served.wait_started()
        else:
            import anyio

            from toolrollout.engines._factory import connect

            async def check() -> None:  # healthy, and of one kind (SGLang or vLLM)
                async with await connect(
                    self.urls, health_timeout=self._timeout, engine=self.engine,
                    api_key=self.api_key,
                ):  # fmt: skip
                    pass

            anyio.run(check)
        return self.urls


class _ServedEngine:
    """The shared ``toolrollout serve``, supervised (:func:`~toolrollout._supervisor.supervise`)
    on an event loop in a thread of its own, since the driver is synchronous: restarted
    when it dies or stops answering ``/health``, within the default
    :class:`~toolrollout._supervisor.RestartPolicy`, with the supervisor's log lines.

    It starts loading its model on entry; :meth:`wait_started` waits for its first start.
    """

    def __init__(self, command: ServiceCommand, policy: RestartPolicy | None = None) -> None:
        self._command, self._policy = command, policy
        self._started = threading.Event()
        self.service: SupervisedService | None = None

    def __enter__(self) -> Self:
        self._portal_context = start_blocking_portal()
        self._portal = self._portal_context.__enter__()
        try:
            self._stop: anyio.Event = self._portal.call(anyio.Event)
            self._held = self._portal.start_task_soon(self._hold)
        except BaseException:
            self._portal_context.__exit__(None, None, None)
            raise
        return self

    async def _hold(self) -> None:
        async with supervise(self._command, self._policy) as service:
            self.service = service
            self._started.set()
            await self._stop.wait()

    def wait_started(self) -> None:
        """Return once it has started; raise its start-up error when it could not."""
        while not self._started.wait(0.1):
            if self._held.done():
                self._held.result()  # raises the start-up error
                raise DistributedError("the shared `toolrollout serve` for --ray stopped")

    def __exit__(self, *exc_info: object) -> None:
        try:
            if self._started.is_set():
                self._portal.call(self._stop.set)
            else:  # still starting (the run failed first): stop it without waiting for it
                self._held.cancel()
        finally:
            self._portal_context.__exit__(None, None, None)  # the task has finished


def _portable(spec: RunSpec) -> RunSpec:
    """``spec`` with absolute paths, the same on every node of a shared filesystem."""
    return spec.replace(
        model=spec.model_path.resolve(),
        tool_config=spec.tool_config.resolve() if spec.tool_config else None,
        interaction_config=(spec.interaction_config.resolve() if spec.interaction_config else None),
    )


@contextmanager
def _engine(ray: Any, spec: RunSpec, options: RayOptions) -> Iterator[_Engines]:
    """The servers every actor uses: the given URLs, or one shared ``toolrollout serve``
    started here (one model copy for the whole cluster, never one per actor)."""
    if spec.engine_urls:
        yield _Engines(
            list(spec.engine_urls), spec.health_timeout, api_key=spec.engine_api_key,
            engine=spec.engine,
        )  # fmt: skip
        return
    from toolrollout.sandbox._background import free_port

    # A local cluster reaches it on loopback; a real cluster at this node's address.
    if options.address:
        bind, advertise = "0.0.0.0", str(ray.util.get_node_ip_address())
    else:
        bind = advertise = "127.0.0.1"
    port = free_port("127.0.0.1" if bind == "0.0.0.0" else bind)

    command = [
        sys.executable,
        "-m",
        "toolrollout",
        "serve",
        "--model",
        str(spec.model_path),
        "--host",
        bind,
        "--port",
        str(port),
        "--threads",
        str(spec.threads),
        "--log-level",
        "warning",
    ]
    # One key for this run's server: in its environment, not its argv (the process list).
    key = secrets.token_urlsafe(32)
    env = {k: v for k, v in os.environ.items() if k != ADMIN_API_KEY_ENV}
    env[API_KEY_ENV] = key  # the workers abort requests too: no separate admin key
    url = f"http://{advertise}:{port}"
    local = f"http://{'127.0.0.1' if bind == '0.0.0.0' else bind}:{port}"

    async def healthy(client: httpx.AsyncClient) -> bool:
        return (await client.get(f"{local}/health")).status_code == 200

    def startup_error(status: int | None, output: str) -> Exception:
        if status is None:
            return DistributedError(
                f"the shared `toolrollout serve` for --ray was not healthy at {url} "
                f"after {spec.health_timeout:.0f} s"
            )
        tail = output.strip().splitlines()[-1:]
        return DistributedError(
            f"the shared `toolrollout serve` for --ray exited with {status}: {' '.join(tail)}"
        )

    # Supervised: behind the parent-death launcher (a SIGKILL of the driver takes it along),
    # restarted when it dies or hangs, stopped (with its process group) when the run ends.
    service = ServiceCommand(
        kind="engine server",
        argv=tuple(command),
        host="127.0.0.1" if bind == "0.0.0.0" else bind,
        port=port,
        ready=healthy,
        env=env,
        startup_timeout=spec.health_timeout,
        startup_error=startup_error,
    )
    with _ServedEngine(service) as served:
        yield _Engines([url], spec.health_timeout, served, api_key=key)


@dataclass(frozen=True)
class _Collected:
    trajectories: tuple[Trajectory, ...]
    rows_written: int
    shards: tuple[dict[str, Any], ...]
    failures: tuple[str, ...]
    interrupted: str | None
    leftover: tuple[Trajectory, ...] = ()


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
    engine: _Engines,
    target: tuple[int, bool] | None = None,
) -> _Collected:
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
        return _Collected((), 0, tuple(shards), tuple(m for _, m in failed), interrupted)
    if interrupted is None:
        rows_failed, adopted = _account_for_failures(failed, prompts, group_ids, skip, parts)
        rows.extend(rows_failed)
        written += len(rows_failed) + adopted
    return _Collected(
        trajectories=tuple(rows),
        rows_written=written,
        shards=tuple(sorted(shards, key=lambda s: int(s["shard"]))),
        failures=tuple(message for _, message in failed),
        interrupted=interrupted,
    )


def _lost_sample(
    prompts: Sequence[RolloutPrompt],
    group_ids: Sequence[str],
    prompt_index: int,
    sample_index: int,
    message: str,
) -> Trajectory:
    """The ``failed`` row standing for a sample whose worker died before returning it."""
    return failed_trajectory(
        group_id=group_ids[prompt_index],
        prompt_index=prompt_index,
        sample_index=sample_index,
        prompt=prompts[prompt_index],
        reason="error",
        error=f"DistributedError: {message}",
    )


def _split_batch(
    rows: list[Trajectory],
    chosen: set[tuple[str, int]],
    failed: list[tuple[ShardJob, str]],
    prompts: Sequence[RolloutPrompt],
    group_ids: Sequence[str],
    parts: Path,
    shards: list[dict[str, Any]],
) -> _Collected:
    """Write the coordinator's batch into ``parts``; everything else is the leftover.

    A dead shard's samples come back as ``failed`` rows in the leftover (its rows never
    reach the driver, so a group it had finished is missing from the batch; the failure
    line says which shard).
    """
    lost = [
        _lost_sample(prompts, group_ids, p, s, message)
        for job, message in failed
        for p in job.prompt_indices
        for s in range(job.spec.config.n)
    ]
    ordered = sorted(rows + lost, key=lambda t: (t.prompt_index, t.sample_index))
    batch = [t for t in ordered if (t.group_id, t.sample_index) in chosen]
    with ShardWriter(parts) as writer:
        for trajectory in batch:
            writer.write(trajectory)
    return _Collected(
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
    return f"ray shard {job.shard} (prompts {_span(job.prompt_indices)}) failed: {detail}"


def _span(indices: tuple[int, ...]) -> str:
    shown = ",".join(str(i) for i in indices[:4])
    return f"{shown},..." if len(indices) > 4 else shown or "none"


def _account_for_failures(
    failed: list[tuple[ShardJob, str]],
    prompts: Sequence[RolloutPrompt],
    group_ids: Sequence[str],
    skip: frozenset[tuple[int, int]],
    parts: Path,
) -> tuple[list[Trajectory], int]:
    """Keep what failed workers had written; a ``failed`` row for each sample still missing."""
    rows: list[Trajectory] = []
    adopted_rows = 0
    for job, message in failed:
        adopted = _adopt(Path(job.spill_dir), parts)
        adopted_rows += len(adopted)
        have = skip | adopted
        for prompt_index in job.prompt_indices:
            for sample_index in range(job.spec.config.n):
                if (prompt_index, sample_index) in have:
                    continue
                rows.append(_lost_sample(prompts, group_ids, prompt_index, sample_index, message))
    if rows:
        with ShardWriter(parts) as writer:
            for row in rows:
                writer.write(row)
    return rows, adopted_rows


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


def _adopt_all(spills: list[Path], parts: Path) -> frozenset[tuple[int, int]]:
    adopted: set[tuple[int, int]] = set()
    for spill in spills:
        adopted |= _adopt(spill, parts)
    return frozenset(adopted)
