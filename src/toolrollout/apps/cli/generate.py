"""``toolrollout generate``: roll out a dataset and write trajectories to parquet.

With no options it runs the bundled demo end to end: the embedded engine with the demo
model, the demo prompts, the real calculator tool, numeric-match rewards, and writes
``trajectories.parquet``. Without ``--dataset`` the demo prompt set matching the configured
tools is used (``python`` tool: the python prompts, ``search`` tool: the search prompts,
anything else: the calculator prompts). User mistakes exit with a one-line message and code 2.

Rows stream as crash-safe parquet shards into ``<out>.parts/`` while the run goes on; when
every sample has its row the shards are merged into ``<out>``, the run is marked finished
and the folder is removed, in that order (``finish_shards``), so a kill while finishing
leaves a folder that ``--resume`` completes (or only cleans up) without a row changing.
After a crash, ``--resume`` runs only the samples without a row. SIGINT/SIGTERM abort the
in-flight engine requests, keep the finished rows, stop tool services and exit 130/143
with a summary on stderr.

A ``--target-groups`` run writes only its batch to ``<out>``; what it left over (the
aborted trajectories with every token so far, and their finished siblings) is saved to
``<out stem>.leftover.parquet`` (or ``--leftover``), and ``--resume-leftover FILE``
continues exactly those trajectories in a later run.
"""

from __future__ import annotations

import contextlib
import json
import math
import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from toolrollout.apps.cli._common import fail, require_extra
from toolrollout.apps.cli._options import RUN, command, opt, pick, spec_from, user_message

if TYPE_CHECKING:
    from toolrollout.engines import Engine, EngineInfo
    from toolrollout.rollout import RolloutPrompt, Trajectory
    from toolrollout.spec import RunParts, RunSpec

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
        if _finish_earlier_run(flags):
            return
        summary = _run(flags)
    except ToolRolloutError as exc:
        raise fail(user_message(exc, OPTIONS)) from None
    except OSError as exc:
        raise fail(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")) from None
    _finish(summary, flags.out)


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
    parts: RunParts
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


def _finish(summary: dict[str, Any], out: Path) -> None:
    """Print the summary and exit as the run ended (130/143 after a signal)."""
    if summary["interrupted"] is not None and summary.get("batch_run"):
        typer.echo(
            f"interrupted by {summary['interrupted']}: a --target-groups or --resume-leftover "
            "run writes its batch and leftover only at the end, so nothing was written",
            err=True,
        )
        raise typer.Exit(code=143 if summary["interrupted"] == "SIGTERM" else 130)
    for failure in summary.get("ray_failures", ()):
        typer.echo(f"warning: {failure}", err=True)
    if summary["interrupted"] is not None:
        _print_summary(summary, out, err=True)
        typer.echo(
            f"interrupted by {summary['interrupted']}: {summary['rows_on_disk']} of "
            f"{summary['total']} rows kept in {summary['parts']}; "
            "rerun with --resume to complete the run",
            err=True,
        )
        code = 143 if summary["interrupted"] == "SIGTERM" else 130
        raise typer.Exit(code=code)
    _print_summary(summary, out)


def _run(flags: Any) -> dict[str, Any]:
    """flags -> RunSpec -> rows on disk; returns the summary the command prints."""
    import anyio

    from toolrollout.rollout import finish_shards

    ray = _ray_options(flags)
    plan = _plan(flags)
    _open_folder(plan, flags)
    if ray is not None:
        return _run_ray(plan, flags, ray)
    summary = anyio.run(_run_local, plan, flags)
    if summary["interrupted"] is None:
        finish_shards(plan.folder, flags.out, metadata=plan.metadata)
    return summary


def _finish_earlier_run(flags: Any) -> bool:
    """Complete the clean-up of a run killed while finishing; True when nothing is left.

    The folder of a run whose merged file is written carries the ``finished`` mark (or,
    at the very end, no manifest and no shard): its rows are all in ``--out``, so it is
    only deleted. ``--resume`` then has nothing to do (exit 0); a fresh run goes on.
    """
    from toolrollout._exceptions import UserError
    from toolrollout.rollout import clean_finished, finished_mark

    if _batch_run(flags):
        return False
    parts = flags.out.with_name(flags.out.name + ".parts")
    if not parts.is_dir():
        if flags.resume and flags.out.is_file():
            typer.echo(f"nothing to resume: {flags.out} is complete (no {parts} left)")
            return True
        return False
    mark = finished_mark(parts)
    if mark is None:
        bare = not (parts / _MANIFEST).exists() and not any(parts.glob("**/part-*.parquet"))
        if not (bare and flags.out.is_file()):
            return False  # an unfinished run (or an empty folder of a run never started)
    elif not Path(str(mark.get("out"))).is_file():
        raise UserError(
            f"{parts} says its run finished into {mark.get('out')}, but that file is "
            f"missing: delete {parts} and run again"
        )
    clean_finished(parts)
    rows = f" ({mark['rows']} rows)" if mark is not None else ""
    if flags.resume:
        typer.echo(
            f"nothing to resume: the run had finished into {flags.out}{rows}; "
            f"removed what its interrupted clean-up left in {parts}"
        )
        return True
    typer.echo(
        f"note: removed {parts}, left by a finished run of {flags.out}{rows} whose "
        "clean-up was cut short",
        err=True,
    )
    return False


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
    from toolrollout.spec import (
        chat_setup,
        check_leftover_matches,
        effective_tool_parser,
        leftover_info,
        load_parts,
        run_metadata,
    )

    _check_flags(flags)
    carried, saved, n = _read_carried(flags)
    spec = spec_from(flags, OPTIONS, {"config.n": n})
    parts = load_parts(spec)
    # Each renders the template's probe once: done here, once, for the check and the info.
    tool_parser = effective_tool_parser(spec.config, parts.tokenizer)
    chat = chat_setup(spec.config, parts.tokenizer)
    metadata = run_metadata(spec.config, parts.tokenizer, chat=chat)
    if flags.resume_leftover is not None:
        check_leftover_matches(
            flags.resume_leftover,
            saved,
            tool_names=parts.tool_names,
            tool_parser=tool_parser,
            tokenizer=parts.tokenizer,
            model=spec.model_path,
            chat=chat,
            sampling=metadata["sampling"],
        )
    prompts, prompts_path = _prompts(flags, parts, carried)
    truths = [p.ground_truth for p in prompts] + [t.ground_truth for t in carried]
    spec = spec.replace(rewards=spec.rewards_for(truths))
    info = leftover_info(
        n=n,
        tool_names=parts.tool_names,
        tool_parser=tool_parser,
        tokenizer=parts.tokenizer,
        model=spec.model_path,
        chat=chat,
        sampling=metadata["sampling"],
    )
    return _Plan(
        spec,
        parts,
        prompts,
        carried,
        prompts_path,
        leftover_info=info,
        leftover_path=_leftover_path(flags),
        metadata=metadata,
    )


def _prompts(
    flags: Any, parts: RunParts, carried: list[Trajectory]
) -> tuple[list[RolloutPrompt], Path]:
    """The prompts to launch (none when resuming a leftover) and the file they come from."""
    from toolrollout._exceptions import UserError
    from toolrollout.apps.demo import demo_prompts_for_tools
    from toolrollout.data import load_prompts
    from toolrollout.rollout import resume_prompt
    from toolrollout.spec import check_interactions

    if flags.resume_leftover is not None:
        resumable = [t for t in carried if t.resume_point is not None]
        check_interactions(
            parts.interactions,
            [resume_prompt(t.resume_point) for t in resumable if t.resume_point is not None],
            source=str(flags.resume_leftover),
            names=[f"trajectory {t.uid}" for t in resumable],
        )
        return [], flags.resume_leftover
    path = flags.dataset or demo_prompts_for_tools(parts.tool_names)
    prompts = load_prompts(path, limit=flags.limit)
    check_interactions(parts.interactions, prompts, source=str(path))
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
    run_id = _open_run_folder(
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


def _run_ray(plan: _Plan, flags: Any, ray: Any) -> dict[str, Any]:
    """The run sharded over Ray actors (``--ray``), merged as a one-machine run would be."""
    from toolrollout.apps.distributed import run_sharded
    from toolrollout.rollout import finish_shards, write_leftover

    if plan.spec.engine_urls:  # the servers the workers share: their facts go in the file
        _record_engine(plan, _servers_info(plan.spec), resumed=bool(plan.skip))
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
        write_leftover(report.leftover, _leftover_path(flags), info=plan.leftover_info)
    summary = _summarise(list(report.trajectories), report.seconds)
    summary.update(
        interrupted=report.interrupted,
        total=len(plan.prompts) * plan.spec.config.n,
        resumed=report.resumed,
        rows_on_disk=report.rows_on_disk,
        parts=str(plan.folder),
        ray_failures=list(report.failures),
        ray_shards=list(report.shards),
        batch_run=_batch_run(flags),
    )
    if batch:
        summary.update(left_over=len(report.leftover), leftover_path=str(_leftover_path(flags)))
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


async def _run_local(plan: _Plan, flags: Any) -> dict[str, Any]:
    """The run on this machine: rows stream into the shard folder as they finish."""
    import anyio

    from toolrollout.engines import WorkHistory
    from toolrollout.rollout import ShardWriter, TrajectoryStatus
    from toolrollout.spec import open_run

    from ._progress import RolloutProgress

    interrupted: list[str] = []
    trajectories: list[Trajectory] = []
    left_over: list[int] = []
    carried = plan.carried
    total = len(carried) if carried else len(plan.prompts) * plan.spec.config.n
    already = sum(1 for t in carried if t.status is not TrajectoryStatus.ABORTED)
    async with open_run(plan.spec, parts=plan.parts) as run:
        _record_engine(plan, await run.engine.info(), resumed=bool(plan.skip))
        if flags.work_history is not None:
            run.runner.work_history = WorkHistory.read(flags.work_history)
        frozen = _freeze_gc() if flags.gc_freeze else None
        threshold = GC_THRESHOLD_DEFAULT if flags.gc_threshold is None else flags.gc_threshold
        with _collect_young_later(threshold) as thresholds:
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
                        left_over.append(len(batch.leftover))
                    tg.cancel_scope.cancel()
            elapsed = time.perf_counter() - started
        if frozen is not None:
            import gc

            gc.unfreeze()
        if flags.work_history is not None and run.runner.work_history is not None:
            run.runner.work_history.write(flags.work_history)
    summary = _summarise(trajectories, elapsed)
    summary.update(
        interrupted=interrupted[0] if interrupted else None,
        total=total,
        resumed=len(plan.skip),
        rows_on_disk=len(plan.skip) + writer.rows_written,
        parts=str(plan.folder),
        left_over=left_over[0] if left_over else None,
        leftover_path=str(_leftover_path(flags)) if left_over else None,
        batch_run=_batch_run(flags),
    )
    if frozen is not None:
        summary["gc_frozen_objects"] = frozen
    summary["gc_threshold"] = list(thresholds)
    return summary


def _freeze_gc() -> int:
    """``gc.freeze()``: everything allocated so far (the imported libraries, the model, the
    tokenizer, the tools) leaves the collector's generations for the run, so each full
    collection walks the run's own objects only. The application's choice, not the
    library's: a reference cycle among frozen objects is never freed while frozen, which
    is harmless for what a run loads once and keeps. Returns how many objects it froze."""
    import gc

    gc.collect()  # free what loading left behind first, rather than freezing it
    gc.freeze()
    return gc.get_freeze_count()


@contextlib.contextmanager
def _collect_young_later(allocations: int) -> Iterator[tuple[int, int, int]]:
    """``gc.set_threshold(allocations, ...)`` for the block, the thresholds before it
    restored after it (a ``generate`` called in a process that goes on, a test's, keeps
    its own); yields the thresholds in effect. The youngest generation is collected after
    that many allocations. Python's 700 promotes everything that lives a few milliseconds,
    and at 10,000 trajectories every request in flight does; the oldest generation then
    grows fast enough to trigger a full collection (a second or more) every few seconds.
    The application's choice, like ``--gc-freeze``: it changes the whole process."""
    import gc

    before = gc.get_threshold()
    _, middle, oldest = before
    gc.set_threshold(allocations, middle, oldest)
    try:
        yield (allocations, middle, oldest)
    finally:
        gc.set_threshold(*before)


async def _roll_batch(plan: _Plan, runner: Any, on_result: Any) -> Any:
    """A ``--target-groups`` or ``--resume-leftover`` batch; its leftover is saved here."""
    from toolrollout.rollout import write_leftover

    spec = plan.spec
    if plan.carried:
        batch = await runner.resume(
            plan.carried,
            target_groups=spec.target_groups,
            keep_groups_whole=spec.keep_groups_whole,
            on_result=on_result,
        )
    else:
        assert spec.target_groups is not None
        batch = await runner.run_batch(
            plan.prompts,
            target_groups=spec.target_groups,
            keep_groups_whole=spec.keep_groups_whole,
            on_result=on_result,
            group_ids=plan.group_ids,
        )
    # Replaced atomically, after the batch (a file being resumed may be this very path: it
    # was read in full before the run).
    leftover_path = plan.leftover_path
    write_leftover(batch.leftover, leftover_path, info=plan.leftover_info)
    return batch


def _ray_options(flags: Any) -> Any:
    """The ``--ray*`` options as RayOptions, or None for a one-machine run."""
    from toolrollout._exceptions import UserError

    if not flags.ray:
        if flags.ray_address is not None:
            raise UserError("--ray-address needs --ray")
        return None
    from toolrollout.apps.distributed import RayOptions, import_ray

    options = RayOptions(workers=flags.ray_workers, address=flags.ray_address)
    if flags.resume_leftover is not None:
        raise UserError("--resume-leftover does not work with --ray yet; run it without --ray")
    if flags.gc_freeze:
        raise UserError("--gc-freeze applies to a local run, not to --ray workers yet")
    if flags.gc_threshold is not None:
        raise UserError("--gc-threshold applies to a local run, not to --ray workers yet")
    import_ray()  # not installed: say how, before anything is written
    return options


_MANIFEST = "run.json"  # toolrollout.rollout._output.MANIFEST


def _record_engine(plan: _Plan, info: EngineInfo, *, resumed: bool) -> None:
    """Add the engine's facts to the run metadata; on a resume, warn when the rows kept were
    sampled by another engine, version or dtype than the rows to come (their sampling
    settings and tokenizer were checked against the run manifest already)."""
    from toolrollout.rollout import read_run_metadata
    from toolrollout.spec import engine_facts

    plan.metadata["engine"] = facts = engine_facts(info)
    if not resumed:
        return
    shards = sorted(plan.folder.glob("part-*.parquet"))
    before = (read_run_metadata(shards[-1]) or {}).get("engine") if shards else None
    if not isinstance(before, dict):
        return
    keys = ("engine", "engine_version", "dtype", "model_path")
    changed = [k for k in keys if before.get(k) != facts[k]]
    if changed:
        detail = ", ".join(f"{k} {before.get(k)!r} (now {facts[k]!r})" for k in changed)
        typer.echo(
            f"warning: --resume: the rows kept were sampled with {detail}; the file's "
            "metadata records the engine of the rows written last",
            err=True,
        )


def _open_run_folder(
    parts: Path,
    *,
    dataset: Path,
    num_prompts: int,
    n: int,
    resume: bool,
    sampling: dict[str, Any],
    tokenizer: dict[str, Any],
) -> str:
    """Start or reopen the shard folder; returns the run id that makes group ids stable.

    A resume must sample from the interrupted run's distribution (temperature, top-p,
    top-k, min-p) and render with the same tokenizer; manifests written before these were
    recorded are not checked for them.
    """
    from toolrollout._exceptions import UserError
    from toolrollout.spec import sampling_changes

    identity = {
        "dataset": str(dataset.resolve()),
        "num_prompts": num_prompts,
        "n": n,
    }
    rendering = {
        "fingerprint": tokenizer.get("fingerprint"),
        "family": tokenizer.get("family"),
        "chat_template_kwargs": tokenizer.get("chat_template_kwargs"),
    }
    manifest = parts / _MANIFEST
    if resume:
        if not manifest.is_file():
            raise UserError(f"nothing to resume: {manifest} not found")
        try:
            saved = json.loads(manifest.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise UserError(f"{manifest}: unreadable run manifest ({exc})") from exc
        for key, value in identity.items():
            if saved.get(key) != value:
                raise UserError(
                    f"--resume: {key} is {value!r} but the interrupted run used "
                    f"{saved.get(key)!r} ({manifest})"
                )
        if "sampling" in saved and sampling_changes(saved["sampling"], sampling):
            raise UserError(
                f"--resume: the interrupted run sampled with "
                f"{sampling_changes(saved['sampling'], sampling)}: pass its sampling flags "
                f"({manifest})"
            )
        if "tokenizer" in saved and saved["tokenizer"] != rendering:
            raise UserError(
                f"--resume: the interrupted run rendered with another tokenizer, family or "
                f"chat-template kwargs ({saved['tokenizer']}; now {rendering}) ({manifest})"
            )
        return str(saved["run_id"])
    # */part-*: the worker folders of a `--ray` run (docs/scale-out.md)
    if any(parts.glob("part-*.parquet")) or any(parts.glob("*/part-*.parquet")):
        raise UserError(
            f"{parts} holds an unfinished run: pass --resume to complete it, or delete it"
        )
    parts.mkdir(parents=True, exist_ok=True)
    run_id = uuid.uuid4().hex[:8]
    saved = {"run_id": run_id, **identity, "sampling": sampling, "tokenizer": rendering}
    manifest.write_text(json.dumps(saved) + "\n", encoding="utf-8")
    return run_id


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


def _summarise(trajectories: list[Any], elapsed: float) -> dict[str, Any]:
    from toolrollout.rollout import TrajectoryStatus

    rewards = [t.reward for t in trajectories if t.reward is not None]
    count = max(len(trajectories), 1)
    return {
        "trajectories": len(trajectories),
        "seconds": elapsed,
        "mean_reward": sum(rewards) / len(rewards) if rewards else None,
        "mean_turns": sum(t.num_turns for t in trajectories) / count,
        "tool_calls": sum(t.num_tool_calls for t in trajectories),
        "tool_errors": sum(t.tool_errors for t in trajectories),
        "parse_errors": sum(t.parse_errors for t in trajectories),
        "drift": sum(int(t.metrics.get("drift_mismatches", 0)) for t in trajectories),
        "statuses": dict(Counter(str(t.status) for t in trajectories)),
        "failures": dict(
            Counter(
                t.finish_reason or "unknown"
                for t in trajectories
                if t.status is TrajectoryStatus.FAILED
            )
        ),
        "model_tokens": sum(int(t.metrics.get("model_tokens", 0)) for t in trajectories),
        "engine_moves": sum(len(t.metrics.get("engine_moves", ())) for t in trajectories),
    }


def _print_summary(summary: dict[str, Any], out: Path, *, err: bool = False) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"toolrollout generate -> {out}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    mean_reward = summary["mean_reward"]
    rows = [
        ("trajectories", str(summary["trajectories"])),
        *(
            (f"failed: {cause}" + (" (not scored)" if cause == "tool_unavailable" else ""), str(n))
            for cause, n in sorted(summary.get("failures", {}).items())
        ),
        ("mean reward", "-" if mean_reward is None else f"{mean_reward:.3f}"),
        ("mean turns", f"{summary['mean_turns']:.2f}"),
        ("tool calls", str(summary["tool_calls"])),
        ("tool errors", str(summary["tool_errors"])),
        ("parse errors", str(summary["parse_errors"])),
        ("drift mismatches", str(summary["drift"])),
        ("generated tokens/s", f"{summary['model_tokens'] / max(summary['seconds'], 1e-9):.1f}"),
        ("wall seconds", f"{summary['seconds']:.1f}"),
    ]
    if summary.get("engine_moves"):
        rows.append(("moved to another server (failover)", str(summary["engine_moves"])))
    if summary.get("gc_frozen_objects") is not None:
        rows.append(("objects frozen (--gc-freeze)", f"{summary['gc_frozen_objects']:,}"))
    if summary.get("gc_threshold") is not None:
        thresholds = ", ".join(f"{n:,}" for n in summary["gc_threshold"])
        rows.append(("collector thresholds (--gc-threshold)", thresholds))
    if summary.get("resumed"):
        rows.append(("rows kept from before", str(summary["resumed"])))
    if summary.get("left_over") is not None:
        rows.append(
            (
                "left over (straggler control)",
                f"{summary['left_over']} -> {summary['leftover_path']}",
            )
        )
    rows += [(f"status {k}", str(v)) for k, v in sorted(summary["statuses"].items())]
    rows += [
        (f"ray shard {s['shard']}", f"{s['rows']} rows on {s['host']} ({s['seconds']:.1f} s)")
        for s in summary.get("ray_shards", ())
    ]
    for name, value in rows:
        table.add_row(name, value)
    Console(stderr=err).print(table)


def register(app: typer.Typer) -> None:
    """Add the ``generate`` command to the ``toolrollout`` app."""
    command(app, "generate", OPTIONS, generate, generate.__doc__ or "")
