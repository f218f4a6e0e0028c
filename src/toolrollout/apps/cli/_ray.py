"""``generate --ray``: the run sharded over Ray actors that share the engine servers
(:mod:`toolrollout.apps.distributed`), merged into one file as a one-machine run's is."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from toolrollout.apps.cli._run_folder import record_engine

if TYPE_CHECKING:
    from toolrollout.engines import EngineInfo
    from toolrollout.spec import RunSpec

__all__ = ["ray_options", "run_ray"]


def ray_options(flags: Any) -> Any:
    """The ``--ray*`` options as RayOptions, or None for a one-machine run."""
    from toolrollout._exceptions import UserError

    if not flags.ray:
        if flags.ray_address is not None:
            raise UserError("--ray-address needs --ray")
        return None
    from toolrollout.apps.distributed._driver import RayOptions, import_ray

    options = RayOptions(workers=flags.ray_workers, address=flags.ray_address)
    if flags.resume_leftover is not None:
        raise UserError("--resume-leftover does not work with --ray yet; run it without --ray")
    if flags.gc_freeze:
        raise UserError("--gc-freeze applies to a local run, not to --ray workers yet")
    if flags.gc_threshold is not None:
        raise UserError("--gc-threshold applies to a local run, not to --ray workers yet")
    import_ray()  # not installed: say how, before anything is written
    return options


def run_ray(
    plan: Any, flags: Any, ray: Any, summary_of: Callable[..., dict[str, Any]]
) -> dict[str, Any]:
    """The run sharded over Ray actors (``--ray``), merged as a one-machine run would be."""
    from toolrollout.apps.distributed._driver import run_sharded
    from toolrollout.rollout import finish_shards, write_leftover

    if plan.spec.engine_urls:  # the servers the workers share: their facts go in the file
        record_engine(plan.metadata, plan.folder, _servers_info(plan.spec), resumed=bool(plan.skip))
    report = run_sharded(
        plan.prompts,
        spec=plan.spec,
        group_ids=plan.group_ids,
        parts=plan.folder,
        options=ray,
        skip=frozenset(plan.skip),
        run_id=plan.run_id,
    )
    batch = flags.target_groups is not None and report.interrupted is None
    if batch:  # the leftover of every shard, merged: one file, as without --ray
        write_leftover(report.leftover, plan.leftover_path, info=plan.leftover_info)
    summary = summary_of(
        list(report.trajectories),
        report.seconds,
        interrupted=report.interrupted,
        total=len(plan.prompts) * plan.spec.config.n,
        resumed=report.resumed,
        rows_on_disk=report.rows_on_disk,
        left_over=len(report.leftover) if batch else None,
        ray_failures=list(report.failures),
        ray_shards=list(report.shards),
    )
    if report.interrupted is None:  # without URLs each worker's engine is its own: no facts
        finish_shards(plan.folder, flags.out, metadata=plan.metadata)
    return summary


def _servers_info(spec: RunSpec) -> EngineInfo:
    """What the servers a ``--ray`` run shares report, asked once from the driver."""
    import anyio

    from toolrollout.engines._factory import connect

    async def ask() -> EngineInfo:
        async with await connect(
            spec.engine_urls, health_timeout=spec.health_timeout, engine=spec.engine,
            **spec.client_options(),
        ) as engine:  # fmt: skip
            return await engine.info()

    return anyio.run(ask)
