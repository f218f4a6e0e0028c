"""``toolrollout generate``: roll out a dataset and write trajectories to parquet.

With no options it runs the bundled demo end to end: the embedded engine with the demo
model, the demo prompts, the real calculator tool, numeric-match rewards, and writes
``trajectories.parquet``. Without ``--dataset`` the demo prompt set matching the configured
tools is used. User mistakes exit with a one-line message and code 2.

Rows stream as crash-safe parquet shards into ``<out>.parts/``, merged into ``<out>`` at the
end (``finish_shards``; docs/fault-tolerance.md has the steps, ``--resume`` and the signals).
A ``--target-groups`` run writes only its batch to ``<out>`` and what it left over to
``<out stem>.leftover.parquet`` (or ``--leftover``), which ``--resume-leftover`` continues.
"""

from __future__ import annotations

import contextlib
import math
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from toolrollout.apps.cli._common import fail, require_extra
from toolrollout.apps.cli._options import RUN, command, opt, pick, spec_from, user_message
from toolrollout.apps.cli._progress import finish, summarise
from toolrollout.apps.cli._run_folder import finish_earlier_run, open_run_folder, record_engine

if TYPE_CHECKING:
    from toolrollout.engines import Engine
    from toolrollout.rollout import RolloutPrompt, Trajectory
    from toolrollout.spec import RunSpec
    from toolrollout.spec._open import RunComponents

__all__ = ["OPTIONS", "generate", "register"]

GC_THRESHOLD_DEFAULT = 100_000
"""``generate``'s collector threshold for its youngest generation unless ``--gc-threshold``
says otherwise (Python's own is 700); measured in docs/benchmarks.md."""

# fmt: off
OPTIONS = [
    *pick(RUN, "engine_url", "engine", "engine_api_key", "model", "dataset", "tool_config",
          "interaction_config", "max_interaction_turns", "turn_reward_weight",
          "tool_reward_weight", "n", "max_turns", "max_new_tokens", "max_response_tokens",
          "temperature", "top_p", "concurrency", "seed", "limit", "tool_parser", "family",
          "chat_template_kwargs", "tool_error_penalty"),
    opt("out", Path, Path("trajectories.parquet"), ".parquet or .jsonl output."),
    *pick(RUN, "health_timeout", "threads", "max_images", "max_image_tokens", "resume",
          "flush_every", "request_timeout", "retries", "retry_budget", "failover_after",
          "trajectory_timeout", "target_groups"),
    opt("oversample", float, 1.0, "With --target-groups: launch this many times the groups "
        "needed.", min=1.0),
    *pick(RUN, "keep_groups_whole", "finish_tools", "inexact_logprobs"),
    opt("leftover", Path | None, None, "Where a --target-groups or --resume-leftover run saves "
        "what it left over (.parquet). Default: <out stem>.leftover.parquet next to --out."),
    opt("resume_leftover", Path | None, None, "Continue the trajectories of a leftover file "
        "(aborted ones from their partial tokens) instead of rolling out a dataset; with "
        "--target-groups again a batch that saves a new leftover."),
    # "\\[" keeps rich's markup from reading "[ray]" as a style tag and dropping it.
    opt("ray", bool, False, "Shard the prompts over Ray actors sharing the engine servers (the "
        "ray extra: pip install -e '.\\[ray]'; docs/scale-out.md).", "--ray"),
    opt("ray_workers", int, 2, "Ray actors with --ray, each rolling out one shard.", min=1),
    opt("ray_address", str | None, None, "Ray cluster to join with --ray ('auto', "
        "'host:6379'). Default: local."),
    RUN["schedule"],
    opt("work_history", Path | None, None, "With --schedule history: a JSON file of how long "
        "each prompt's trajectories ran, read before the run (if it exists) and written after "
        "it, so the next step's run ranks its requests by it (local runs)."),
    opt("gc_freeze", bool, False, "Call gc.freeze() once the engine, tokenizer and tools are "
        "loaded, so Python's full garbage collections skip those objects during the run "
        "(local runs; docs/rollouts.md#concurrency).", "--gc-freeze"),
    opt("gc_threshold", int | None, None, "Collect Python's youngest generation after this "
        "many allocations (gc.set_threshold; the other two thresholds are kept), so objects "
        "that live for a request or a turn die young instead of filling the oldest "
        f"generation. A local run uses {GC_THRESHOLD_DEFAULT} unless told otherwise: against "
        "Python's 700 it took 9-28% off the client's CPU a turn (1,024 and 10,000 "
        "trajectories) and the loop's p99 lag from 48-49 to 19-21 ms at 10,000, for 5-6% more "
        "memory. 700 restores Python's default (docs/rollouts.md#concurrency). --ray workers "
        "keep their own.", "--gc-threshold", min=1),
]
"""The options of ``generate``: the run options of :data:`~._options.RUN` and its own."""
# fmt: on


def generate(flags: Any) -> None:
    """Run multi-turn tool rollouts and write one row per trajectory."""
    require_extra("cli", "toolrollout generate")
    from toolrollout._exceptions import ToolRolloutError

    try:
        if not _batch_run(flags) and finish_earlier_run(flags.out, resume=flags.resume):
            return
        summary = _run(flags)
    except ToolRolloutError as exc:
        raise fail(user_message(exc, OPTIONS)) from None
    except OSError as exc:
        raise fail(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")) from None
    finish(summary, flags.out)


def _batch_run(flags: Any) -> bool:
    """Only the batch is written; what it left over is saved apart."""
    return flags.target_groups is not None or flags.resume_leftover is not None


def _leftover_path(flags: Any) -> Path:
    out: Path = flags.out
    return flags.leftover or out.with_name(f"{out.stem}.leftover.parquet")


@dataclass
class _Plan:
    """What a run rolls out, decided before anything is written."""

    spec: RunSpec
    components: RunComponents
    prompts: list[RolloutPrompt]
    carried: list[Trajectory]
    prompts_path: Path
    folder: Path = Path()
    run_id: str = "run"
    group_ids: list[str] = field(default_factory=list)
    skip: set[tuple[int, int]] = field(default_factory=set)
    leftover_info: dict[str, Any] = field(default_factory=dict)
    leftover_path: Path = Path()
    metadata: dict[str, Any] = field(default_factory=dict)
    """The output file's run metadata (sampling, tokenizer; the engine once it answers)."""


def _run(flags: Any) -> dict[str, Any]:
    """flags -> RunSpec -> rows on disk; returns the summary the command prints."""
    import anyio

    from toolrollout.rollout import finish_shards

    from ._ray import ray_options, run_ray

    ray = ray_options(flags)
    plan = _plan(flags)
    _open_folder(plan, flags)
    if ray is not None:
        return run_ray(plan, flags, ray, lambda *a, **kw: _summary(flags, plan, *a, **kw))
    summary = anyio.run(_run_local, plan, flags)
    if summary["interrupted"] is None:
        finish_shards(plan.folder, flags.out, metadata=plan.metadata)
    return summary


def _check_flags(flags: Any) -> None:
    """The rules between the file options of ``generate`` (RunSpec checks the rest)."""
    from toolrollout._exceptions import UserError

    if flags.leftover is not None and not _batch_run(flags):
        raise UserError("--leftover needs --target-groups or --resume-leftover")
    if flags.work_history is not None:
        if "history" not in {name.strip() for name in flags.schedule.split(",")}:
            raise UserError("--work-history needs --schedule history")
        if flags.ray:
            raise UserError("--work-history is for local runs (each Ray actor keeps its own)")
        from toolrollout.engines import WorkHistory

        WorkHistory.read(flags.work_history)  # a bad file fails before the model loads
    if _leftover_path(flags).suffix != ".parquet":
        raise UserError(f"--leftover must be a .parquet file, got {_leftover_path(flags)}")
    if flags.resume_leftover is not None:
        if flags.resume:
            raise UserError("--resume-leftover cannot be combined with --resume")
        if flags.dataset is not None or flags.limit is not None:
            raise UserError(
                "--resume-leftover continues the leftover's own prompts: drop --dataset/--limit"
            )
        if flags.oversample != 1.0:
            raise UserError("--oversample does not apply to --resume-leftover (its groups are set)")
    elif flags.target_groups is None and flags.oversample != 1.0:
        raise UserError("--oversample needs --target-groups")
    if flags.finish_tools and not _batch_run(flags):
        raise UserError("--finish-tools needs --target-groups or --resume-leftover")


def _read_carried(flags: Any) -> tuple[list[Trajectory], dict[str, Any], int]:
    """The trajectories of ``--resume-leftover``, its info, and the run's ``n``."""
    from toolrollout._exceptions import UserError
    from toolrollout.rollout import read_leftover

    if flags.resume_leftover is None:
        return [], {}, flags.n or 1
    carried, saved = read_leftover(flags.resume_leftover)
    if not carried:
        raise UserError(f"{flags.resume_leftover} holds no trajectories to resume")
    if flags.n is not None and flags.n != saved.get("n"):
        raise UserError(
            f"--n is {flags.n} but the trajectories in {flags.resume_leftover} were run with "
            f"--n {saved.get('n')}"
        )
    return carried, saved, int(saved["n"])


def _plan(flags: Any) -> _Plan:
    """Check the flags, load the tokenizer, tools, prompts or leftover: fail before writing."""
    from toolrollout.rollout._compat import (
        chat_setup,
        check_leftover_matches,
        effective_tool_parser,
        leftover_info,
        run_metadata,
    )
    from toolrollout.spec import load_components

    _check_flags(flags)
    carried, saved, n = _read_carried(flags)
    spec = spec_from(flags, OPTIONS, {"config.n": n})
    components = load_components(spec)
    # Each renders the template's probe once: done here, once, for the check and the info.
    tool_parser = effective_tool_parser(spec.config, components.tokenizer)
    chat = chat_setup(spec.config, components.tokenizer)
    metadata = run_metadata(spec.config, components.tokenizer, chat=chat)
    facts = {
        "tool_names": components.tool_names,
        "tool_parser": tool_parser,
        "tokenizer": components.tokenizer,
        "model": spec.model_path,
        "chat": chat,
        "sampling": metadata["sampling"],
    }
    if flags.resume_leftover is not None:
        check_leftover_matches(flags.resume_leftover, saved, **facts)
    prompts, prompts_path = _prompts(flags, components, carried)
    truths = [p.ground_truth for p in prompts] + [t.ground_truth for t in carried]
    spec = spec.replace(rewards=spec.rewards_for(truths))
    info = leftover_info(n=n, **facts)
    return _Plan(
        spec,
        components,
        prompts,
        carried,
        prompts_path,
        leftover_info=info,
        leftover_path=_leftover_path(flags),
        metadata=metadata,
    )


def _prompts(
    flags: Any, components: RunComponents, carried: list[Trajectory]
) -> tuple[list[RolloutPrompt], Path]:
    """The prompts to launch (none when resuming a leftover) and the file they come from."""
    from toolrollout._exceptions import UserError
    from toolrollout.apps.demo import demo_prompts_for_tools
    from toolrollout.data import load_prompts
    from toolrollout.rollout._resume_payload import resume_prompt
    from toolrollout.spec._open import check_interactions

    if flags.resume_leftover is not None:
        resumable = [t for t in carried if t.resume_point is not None]
        check_interactions(
            components.interactions,
            [resume_prompt(t.resume_point) for t in resumable if t.resume_point is not None],
            source=str(flags.resume_leftover),
            names=[f"trajectory {t.uid}" for t in resumable],
        )
        return [], flags.resume_leftover
    path = flags.dataset or demo_prompts_for_tools(components.tool_names)
    prompts = load_prompts(path, limit=flags.limit)
    check_interactions(components.interactions, prompts, source=str(path))
    if flags.target_groups is not None:
        # Straggler control: launch target x oversample groups, keep the first complete ones.
        launch = math.ceil(flags.target_groups * flags.oversample)
        if launch > len(prompts):
            raise UserError(
                f"--target-groups {flags.target_groups} with --oversample {flags.oversample} "
                f"launches {launch} groups, but {path} has {len(prompts)} prompts"
            )
        prompts = prompts[:launch]
    return prompts, Path(path)


def _open_folder(plan: _Plan, flags: Any) -> None:
    """Start or reopen the run's shard folder; fill in the group ids and the samples done."""
    from toolrollout.rollout import done_samples

    plan.folder = flags.out.with_name(flags.out.name + ".parts")
    carried = plan.carried
    num_groups = len({t.group_id for t in carried}) if carried else len(plan.prompts)
    run_id = open_run_folder(
        plan.folder,
        dataset=plan.prompts_path,
        num_prompts=num_groups,
        n=plan.spec.config.n,
        resume=flags.resume,
        sampling=plan.metadata["sampling"],
        tokenizer=plan.metadata["tokenizer"],
    )
    plan.group_ids = [f"{run_id}-p{i}" for i in range(len(plan.prompts))]
    plan.skip = done_samples(plan.folder) if flags.resume else set()
    plan.run_id = run_id


async def _run_local(plan: _Plan, flags: Any) -> dict[str, Any]:
    """The run on this machine: rows stream into the shard folder as they finish."""
    import anyio

    from toolrollout.engines import WorkHistory
    from toolrollout.rollout import ShardWriter, TrajectoryStatus
    from toolrollout.spec import open_run

    from ._progress import RolloutProgress

    interrupted: list[str] = []
    trajectories: list[Trajectory] = []
    left_over: int | None = None
    carried = plan.carried
    total = len(carried) if carried else len(plan.prompts) * plan.spec.config.n
    already = sum(1 for t in carried if t.status is not TrajectoryStatus.ABORTED)
    async with open_run(plan.spec, components=plan.components) as run:
        record_engine(plan.metadata, plan.folder, await run.engine.info(), resumed=bool(plan.skip))
        if flags.work_history is not None:
            run.runner.work_history = WorkHistory.read(flags.work_history)
        with _gc_for_the_run(flags.gc_freeze, flags.gc_threshold) as gc_done:
            started = time.perf_counter()
            with (
                ShardWriter(
                    plan.folder, rows_per_shard=plan.spec.flush_every, metadata=plan.metadata
                ) as writer,
                RolloutProgress(total, completed=len(plan.skip) + already) as progress,
            ):

                def on_result(trajectory: Trajectory) -> None:
                    if interrupted:
                        return  # cut short by the shutdown: --resume reruns it whole
                    progress.update(trajectory)
                    if not _batch_run(flags):
                        writer.write(trajectory)
                        trajectories.append(trajectory)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(_watch_signals, run.engine, interrupted, tg.cancel_scope)
                    if not _batch_run(flags):
                        await run.runner.run(
                            plan.prompts,
                            on_result=on_result,
                            group_ids=plan.group_ids,
                            skip=plan.skip,
                        )
                    else:
                        batch = await _roll_batch(plan, run.runner, on_result)
                        for trajectory in batch.trajectories:
                            writer.write(trajectory)
                            trajectories.append(trajectory)
                        left_over = len(batch.leftover)
                    tg.cancel_scope.cancel()
            elapsed = time.perf_counter() - started
        if flags.work_history is not None and run.runner.work_history is not None:
            run.runner.work_history.write(flags.work_history)
    return _summary(
        flags,
        plan,
        trajectories,
        elapsed,
        interrupted=interrupted[0] if interrupted else None,
        total=total,
        resumed=len(plan.skip),
        rows_on_disk=len(plan.skip) + writer.rows_written,
        left_over=left_over,
        **gc_done,
    )


def _summary(
    flags: Any, plan: _Plan, trajectories: list[Any], seconds: float, **run: Any
) -> dict[str, Any]:
    """The summary the command prints: the trajectories' statistics and how the run went."""
    summary = summarise(trajectories, seconds)
    summary.update(run, parts=str(plan.folder), batch_run=_batch_run(flags))
    if run["left_over"] is not None:
        summary["leftover_path"] = str(_leftover_path(flags))
    return summary


@contextlib.contextmanager
def _gc_for_the_run(freeze: bool, threshold: int | None) -> Iterator[dict[str, Any]]:
    """The collector as ``--gc-freeze`` and ``--gc-threshold`` ask, for the block (why:
    docs/rollouts.md#concurrency); yields what it did, for the summary. Both change the
    whole process, so the thresholds are restored and frozen objects unfrozen after."""
    import gc

    did: dict[str, Any] = {}
    if freeze:
        gc.collect()
        gc.freeze()
        did["gc_frozen_objects"] = gc.get_freeze_count()
    before = gc.get_threshold()
    young = GC_THRESHOLD_DEFAULT if threshold is None else threshold
    gc.set_threshold(young, *before[1:])
    did["gc_threshold"] = [young, *before[1:]]
    try:
        yield did
    finally:
        gc.set_threshold(*before)
        if freeze:
            gc.unfreeze()


async def _roll_batch(plan: _Plan, runner: Any, on_result: Any) -> Any:
    """A ``--target-groups`` or ``--resume-leftover`` batch; its leftover is saved here."""
    from toolrollout.rollout import write_leftover

    spec = plan.spec
    target = {"target_groups": spec.target_groups, "keep_groups_whole": spec.keep_groups_whole}
    if plan.carried:
        batch = await runner.resume(plan.carried, on_result=on_result, **target)
    else:
        batch = await runner.run_batch(
            plan.prompts, on_result=on_result, group_ids=plan.group_ids, **target
        )
    # Replaced atomically, after the batch (a file being resumed may be this very path: it
    # was read in full before the run).
    write_leftover(batch.leftover, plan.leftover_path, info=plan.leftover_info)
    return batch


async def _watch_signals(engine: Engine, interrupted: list[str], scope: Any) -> None:
    """On SIGINT/SIGTERM: stop taking rows, abort in-flight requests, cancel the run."""
    import anyio

    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            interrupted.append(signal.Signals(signum).name)
            with anyio.move_on_after(5.0):
                await engine.abort_all()
            scope.cancel()
            return


def register(app: typer.Typer) -> None:
    """Add the ``generate`` command to the ``toolrollout`` app."""
    command(app, "generate", OPTIONS, generate)
