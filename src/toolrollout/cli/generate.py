"""``toolrollout generate``: roll out a dataset and write trajectories to parquet.

With no options it runs the bundled demo end to end: the embedded engine with the demo
model, the demo prompts, the real calculator tool, numeric-match rewards, and writes
``trajectories.parquet``. Without ``--dataset`` the demo prompt set matching the configured
tools is used (``python`` tool: the python prompts, ``search`` tool: the search prompts,
anything else: the calculator prompts). User mistakes exit with a one-line message and code 2.

Rows stream as crash-safe parquet shards into ``<out>.parts/`` while the run goes on; when
every sample has its row the shards are merged into ``<out>`` and the folder is removed.
After a crash, ``--resume`` runs only the samples without a row. SIGINT/SIGTERM abort the
in-flight engine requests, keep the finished rows, stop tool services and exit 130/143
with a summary on stderr.

A ``--target-groups`` run writes only its batch to ``<out>``; what it left over (the
aborted trajectories with every token so far, and their finished siblings) is saved to
``<out stem>.leftover.parquet`` (or ``--leftover``), and ``--resume-leftover FILE``
continues exactly those trajectories in a later run.
"""

from __future__ import annotations

import json
import shutil
import signal
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import typer

from toolrollout.cli._common import (
    EngineUrlsOption,
    ModelOption,
    fail,
    is_number,
    load_tokenizer,
    require_extra,
    start_engine,
)

__all__ = ["generate", "register"]


def generate(
    engine_url: EngineUrlsOption = None,
    model: ModelOption = None,
    dataset: Annotated[
        Path | None,
        typer.Option(
            help="Prompts (.jsonl or .parquet; verl RL layout accepted). Default: the demo "
            "prompts for the configured tools (python, search or calculator)."
        ),
    ] = None,
    tool_config: Annotated[
        Path | None, typer.Option(help="verl-layout tool config YAML. Default: calculator.")
    ] = None,
    interaction_config: Annotated[
        Path | None,
        typer.Option(
            help="verl-layout interaction config YAML; rows pick one by "
            "extra_info.interaction_kwargs.name."
        ),
    ] = None,
    max_interaction_turns: Annotated[
        int | None,
        typer.Option(min=0, help="Interaction messages appended per trajectory at most."),
    ] = None,
    turn_reward_weight: Annotated[
        float, typer.Option(help="Weight of the summed interaction turn rewards in the reward.")
    ] = 0.0,
    tool_reward_weight: Annotated[
        float, typer.Option(help="Weight of the summed tool rewards in the reward.")
    ] = 0.0,
    n: Annotated[
        int | None,
        typer.Option(
            "--n",
            min=1,
            help="Samples per prompt (GRPO group). Default 1; with --resume-leftover, the "
            "leftover's own.",
        ),
    ] = None,
    max_turns: Annotated[int, typer.Option(min=1, help="Assistant turns per trajectory.")] = 4,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="Tokens per model turn.")] = 128,
    max_response_tokens: Annotated[
        int, typer.Option(min=1, help="Budget over all response tokens.")
    ] = 1024,
    temperature: Annotated[float, typer.Option(min=0.0)] = 1.0,
    top_p: Annotated[float, typer.Option(min=0.0, max=1.0)] = 1.0,
    concurrency: Annotated[int, typer.Option(min=1, help="In-flight engine requests.")] = 64,
    seed: Annotated[int | None, typer.Option(help="Base sampling seed.")] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="Use the first N prompts.")] = None,
    tool_parser: Annotated[str, typer.Option(help="Tool-call format of the model.")] = "qwen25",
    tool_error_penalty: Annotated[
        float, typer.Option(min=0.0, help="Reward penalty per failed or malformed tool call.")
    ] = 0.0,
    out: Annotated[Path, typer.Option(help=".parquet or .jsonl output.")] = Path(
        "trajectories.parquet"
    ),
    health_timeout: Annotated[
        float, typer.Option(help="Seconds to wait for --engine-url servers to be healthy.")
    ] = 120.0,
    threads: Annotated[
        int, typer.Option(min=1, help="Torch threads of the embedded engine (1 suits tiny models).")
    ] = 1,
    max_images: Annotated[
        int | None, typer.Option(min=0, help="Images per trajectory (vision models).")
    ] = None,
    max_image_tokens: Annotated[
        int | None, typer.Option(min=0, help="Image placeholder tokens per trajectory.")
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(help="Complete an interrupted run: only samples without a row are run."),
    ] = False,
    flush_every: Annotated[
        int, typer.Option(min=1, help="Rows per crash-safe shard (at most this many are lost).")
    ] = 64,
    request_timeout: Annotated[
        float, typer.Option(min=0.1, help="Seconds to wait for one engine answer.")
    ] = 600.0,
    retries: Annotated[
        int, typer.Option(min=1, help="Attempts per engine request (5xx, resets, timeouts).")
    ] = 5,
    trajectory_timeout: Annotated[
        float | None, typer.Option(min=0.1, help="Seconds per trajectory before it is failed.")
    ] = None,
    target_groups: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Straggler control: stop once this many complete groups are done; the rest "
            "is aborted on the server and saved to the leftover file, not the output.",
        ),
    ] = None,
    oversample: Annotated[
        float,
        typer.Option(
            min=1.0, help="With --target-groups: launch this many times the groups needed."
        ),
    ] = 1.0,
    keep_groups_whole: Annotated[
        bool,
        typer.Option(
            help="With --target-groups: a group counts only when all its samples finished "
            "(--no-keep-groups-whole: any target x n finished samples)."
        ),
    ] = True,
    leftover: Annotated[
        Path | None,
        typer.Option(
            help="Where a --target-groups or --resume-leftover run saves what it left over "
            "(.parquet). Default: <out stem>.leftover.parquet next to --out.",
        ),
    ] = None,
    resume_leftover: Annotated[
        Path | None,
        typer.Option(
            help="Continue the trajectories of a leftover file (aborted ones from their "
            "partial tokens) instead of rolling out a dataset; with --target-groups again "
            "a batch that saves a new leftover.",
        ),
    ] = None,
    ray: Annotated[
        bool,
        typer.Option(
            "--ray",
            help="Shard the prompts over Ray actors sharing the engine servers "
            "(pip install 'toolrollout[ray]'; docs/scale-out.md).",
        ),
    ] = False,
    ray_workers: Annotated[
        int, typer.Option(min=1, help="Ray actors with --ray, each rolling out one shard.")
    ] = 2,
    ray_address: Annotated[
        str | None,
        typer.Option(help="Ray cluster to join with --ray ('auto', 'host:6379'). Default: local."),
    ] = None,
) -> None:
    """Run multi-turn tool rollouts and write one row per trajectory."""
    require_extra("cli", "toolrollout generate")
    from toolrollout._exceptions import ToolRolloutError

    try:
        summary = _run(
            engine_urls=engine_url or [],
            model=model,
            dataset=dataset,
            tool_config=tool_config,
            interaction_config=interaction_config,
            max_interaction_turns=max_interaction_turns,
            turn_reward_weight=turn_reward_weight,
            tool_reward_weight=tool_reward_weight,
            n=n,
            max_turns=max_turns,
            max_new_tokens=max_new_tokens,
            max_response_tokens=max_response_tokens,
            temperature=temperature,
            top_p=top_p,
            concurrency=concurrency,
            seed=seed,
            limit=limit,
            tool_parser=tool_parser,
            tool_error_penalty=tool_error_penalty,
            out=out,
            health_timeout=health_timeout,
            threads=threads,
            max_images=max_images,
            max_image_tokens=max_image_tokens,
            resume=resume,
            flush_every=flush_every,
            request_timeout=request_timeout,
            retries=retries,
            trajectory_timeout=trajectory_timeout,
            target_groups=target_groups,
            oversample=oversample,
            keep_groups_whole=keep_groups_whole,
            leftover=leftover,
            resume_leftover=resume_leftover,
            ray=_ray_options(ray, ray_workers, ray_address),
        )
    except ToolRolloutError as exc:
        raise fail(str(exc)) from None
    except OSError as exc:
        raise fail(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")) from None
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


def _run(
    *,
    engine_urls: list[str],
    model: Path | None,
    dataset: Path | None,
    tool_config: Path | None,
    interaction_config: Path | None,
    max_interaction_turns: int | None,
    turn_reward_weight: float,
    tool_reward_weight: float,
    n: int | None,
    max_turns: int,
    max_new_tokens: int,
    max_response_tokens: int,
    temperature: float,
    top_p: float,
    concurrency: int,
    seed: int | None,
    limit: int | None,
    tool_parser: str,
    tool_error_penalty: float,
    out: Path,
    health_timeout: float,
    threads: int,
    max_images: int | None = None,
    max_image_tokens: int | None = None,
    resume: bool = False,
    flush_every: int = 64,
    request_timeout: float = 600.0,
    retries: int = 5,
    trajectory_timeout: float | None = None,
    target_groups: int | None = None,
    oversample: float = 1.0,
    keep_groups_whole: bool = True,
    leftover: Path | None = None,
    resume_leftover: Path | None = None,
    ray: Any = None,
) -> dict[str, Any]:
    import math

    import anyio

    from toolrollout._exceptions import UserError
    from toolrollout.chat import tool_parser_names
    from toolrollout.data import load_prompts
    from toolrollout.demo import DEMO_MODEL_PATH, demo_prompts_for_tools
    from toolrollout.engines import RetryPolicy, SamplingParams
    from toolrollout.interactions import load_interaction_config
    from toolrollout.rewards import RewardMix, exact_match, numeric_match
    from toolrollout.rewards import tool_error_penalty as penalty_term
    from toolrollout.rollout import (
        RolloutConfig,
        RolloutRunner,
        ShardWriter,
        Trajectory,
        TrajectoryStatus,
        compact_shards,
        done_samples,
        read_leftover,
        write_leftover,
    )
    from toolrollout.rollout._interactions import select_interaction
    from toolrollout.tools import calculator_tool, load_tool_config, tool_services

    from ._progress import RolloutProgress

    if ray is not None:
        from toolrollout.distributed import import_ray

        if resume_leftover is not None:
            raise UserError("--resume-leftover does not work with --ray yet; run it without --ray")
        import_ray()  # not installed: say how, before anything is written
    if tool_parser not in tool_parser_names():
        raise UserError(
            f"unknown --tool-parser {tool_parser!r}; choose from {', '.join(tool_parser_names())}"
        )
    batch_run = target_groups is not None or resume_leftover is not None
    if leftover is not None and not batch_run:
        raise UserError("--leftover needs --target-groups or --resume-leftover")
    leftover_path = leftover or out.with_name(f"{out.stem}.leftover.parquet")
    if leftover_path.suffix != ".parquet":
        raise UserError(f"--leftover must be a .parquet file, got {leftover_path}")
    carried: list[Trajectory] = []
    saved: dict[str, Any] = {}
    if resume_leftover is not None:
        if resume:
            raise UserError("--resume-leftover cannot be combined with --resume")
        if dataset is not None or limit is not None:
            raise UserError(
                "--resume-leftover continues the leftover's own prompts: drop --dataset/--limit"
            )
        carried, saved = read_leftover(resume_leftover)
        if not carried:
            raise UserError(f"{resume_leftover} holds no trajectories to resume")
        if n is not None and n != saved.get("n"):
            raise UserError(
                f"--n is {n} but the trajectories in {resume_leftover} were run with "
                f"--n {saved.get('n')}"
            )
        n = int(saved["n"])
    n = n or 1
    tools = load_tool_config(tool_config) if tool_config else [calculator_tool()]
    tool_names = sorted(t.name for t in tools)
    interactions = load_interaction_config(interaction_config) if interaction_config else {}
    if resume_leftover is not None:
        _check_leftover_matches(resume_leftover, saved, tool_names, tool_parser)
        prompts_path = resume_leftover
        prompts = []
        for t in carried:  # a row naming an interaction that is not configured: fail now
            if t.resume_point is not None:
                try:
                    select_interaction(interactions, t.resume_point.prompt)
                except UserError as exc:
                    raise UserError(f"{resume_leftover} trajectory {t.uid}: {exc}") from exc
    else:
        prompts_path = dataset or demo_prompts_for_tools(tool_names)
        prompts = load_prompts(prompts_path, limit=limit)
    for index, prompt in enumerate(prompts):  # a row naming an unknown interaction: fail now
        try:
            select_interaction(interactions, prompt)
        except UserError as exc:
            raise UserError(f"{prompts_path} row {index}: {exc}") from exc
    if resume_leftover is not None:
        # The groups are the leftover's; resume() checks --target-groups against them.
        if oversample != 1.0:
            raise UserError("--oversample does not apply to --resume-leftover (its groups are set)")
    elif target_groups is not None:
        # Straggler control: launch target x oversample groups, keep the first complete ones.
        launch = math.ceil(target_groups * oversample)
        if resume:
            raise UserError("--resume cannot be combined with --target-groups")
        if launch > len(prompts):
            raise UserError(
                f"--target-groups {target_groups} with --oversample {oversample} launches "
                f"{launch} groups, but {prompts_path} has {len(prompts)} prompts"
            )
        prompts = prompts[:launch]
    elif oversample != 1.0:
        raise UserError("--oversample needs --target-groups")
    model_path = model or DEMO_MODEL_PATH
    parts = out.with_name(out.name + ".parts")
    tokenizer = load_tokenizer(model_path)
    fingerprint = _tokenizer_fingerprint(tokenizer)
    if resume_leftover is not None and saved.get("tokenizer") != fingerprint:
        raise UserError(
            f"{resume_leftover} was rolled out with another tokenizer than {model_path} "
            f"(model {saved.get('model')!r}): its token ids would mean something else"
        )
    num_groups = len({t.group_id for t in carried}) if carried else len(prompts)
    run_id = _open_run(
        parts, dataset=Path(prompts_path), num_prompts=num_groups, n=n, resume=resume
    )
    group_ids = [f"{run_id}-p{i}" for i in range(len(prompts))]
    skip = done_samples(parts) if resume else set()
    leftover_info = {
        "n": n,
        "tools": tool_names,
        "tool_parser": tool_parser,
        "tokenizer": fingerprint,
        "model": str(model_path),
    }
    config = RolloutConfig(
        sampling=SamplingParams(
            max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p
        ),
        n=n,
        max_turns=max_turns,
        max_response_tokens=max_response_tokens,
        concurrency=concurrency,
        seed=seed,
        tool_parser=tool_parser,
        max_interaction_turns=max_interaction_turns,
        reward_mix=RewardMix(turn_weight=turn_reward_weight, tool_weight=tool_reward_weight),
        max_images=max_images,
        max_image_tokens=max_image_tokens,
        trajectory_timeout=trajectory_timeout,
    )
    vision = None
    if (model_path / "preprocessor_config.json").is_file():
        # A vision-language model: tool images go into its context (docs/multimodal.md).
        from toolrollout.chat import VisionFormat

        vision = VisionFormat.from_pretrained(model_path)
    rewards: list[Any] = []
    truths = [p.ground_truth for p in prompts if p.ground_truth is not None]
    truths += [t.ground_truth for t in carried if t.ground_truth is not None]
    if truths:
        # Numbers compare as numbers ("The answer is 12.0"); other answers must match exactly.
        rewards.append(numeric_match if all(is_number(t) for t in truths) else exact_match)
    if tool_error_penalty > 0:
        rewards.append(penalty_term(tool_error_penalty))
    if ray is not None:
        from toolrollout.distributed import run_sharded

        report = run_sharded(
            prompts,
            group_ids=group_ids,
            config=config,
            model_path=model_path,
            parts=parts,
            options=ray,
            engine_urls=engine_urls,
            tool_config=tool_config,
            interaction_config=interaction_config,
            rewards=rewards,
            vision=vision is not None,
            resume=resume,
            skip=frozenset(skip),
            run_id=run_id,
            threads=threads,
            health_timeout=health_timeout,
            request_timeout=request_timeout,
            retries=retries,
            flush_every=flush_every,
            target_groups=target_groups,
            keep_groups_whole=keep_groups_whole,
        )
        if target_groups is not None and report.interrupted is None:
            # The leftover of every shard, merged: one file, as without --ray.
            write_leftover(report.leftover, leftover_path, info=leftover_info)
        ray_summary = _summarise(list(report.trajectories), report.seconds)
        ray_summary.update(
            interrupted=report.interrupted,
            total=len(prompts) * n,
            resumed=report.resumed,
            rows_on_disk=report.rows_on_disk,
            parts=str(parts),
            ray_failures=list(report.failures),
            ray_shards=list(report.shards),
            batch_run=batch_run,
        )
        if target_groups is not None and report.interrupted is None:
            ray_summary.update(left_over=len(report.leftover), leftover_path=str(leftover_path))
        if report.interrupted is None:
            compact_shards(parts, out)
            shutil.rmtree(parts)
        return ray_summary

    async def main() -> dict[str, Any]:
        engine, context_length = await start_engine(
            engine_urls,
            model_path,
            threads=threads,
            health_timeout=health_timeout,
            timeout=_http_timeout(request_timeout),
            retry=RetryPolicy(max_attempts=retries, retry_read_timeouts=True),
        )
        interrupted: list[str] = []
        trajectories: list[Trajectory] = []
        left_over: list[int] = []
        total = len(carried) if carried else len(prompts) * n
        already = sum(1 for t in carried if t.status is not TrajectoryStatus.ABORTED)
        async with engine, tool_services(tools):
            runner = RolloutRunner(
                engine,
                tokenizer,
                tools,
                config=config,
                rewards=rewards,
                context_length=context_length,
                interactions=interactions,
                vision=vision,
            )
            started = time.perf_counter()
            with (
                ShardWriter(parts, rows_per_shard=flush_every) as writer,
                RolloutProgress(total, completed=len(skip) + already) as progress,
            ):

                def on_result(trajectory: Trajectory) -> None:
                    if interrupted:
                        return  # cut short by the shutdown: --resume reruns it whole
                    progress.update(trajectory)
                    if not batch_run:
                        writer.write(trajectory)
                        trajectories.append(trajectory)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(_watch_signals, engine, interrupted, tg.cancel_scope)
                    if not batch_run:
                        await runner.run(
                            prompts, on_result=on_result, group_ids=group_ids, skip=skip
                        )
                    else:  # only the batch is written; what it left over is saved apart
                        if carried:
                            batch = await runner.resume(
                                carried,
                                target_groups=target_groups,
                                keep_groups_whole=keep_groups_whole,
                                on_result=on_result,
                            )
                        else:
                            assert target_groups is not None
                            batch = await runner.run_batch(
                                prompts,
                                target_groups=target_groups,
                                keep_groups_whole=keep_groups_whole,
                                on_result=on_result,
                                group_ids=group_ids,
                            )
                        for trajectory in batch.trajectories:
                            writer.write(trajectory)
                            trajectories.append(trajectory)
                        # Replaced atomically, after the batch (a file being resumed may be
                        # this very path: it was read in full before the run).
                        write_leftover(batch.leftover, leftover_path, info=leftover_info)
                        left_over.append(len(batch.leftover))
                    tg.cancel_scope.cancel()
            elapsed = time.perf_counter() - started
        summary = _summarise(trajectories, elapsed)
        summary.update(
            interrupted=interrupted[0] if interrupted else None,
            total=total,
            resumed=len(skip),
            rows_on_disk=len(skip) + writer.rows_written,
            parts=str(parts),
            left_over=left_over[0] if left_over else None,
            leftover_path=str(leftover_path) if left_over else None,
            batch_run=batch_run,
        )
        return summary

    summary = anyio.run(main)
    if summary["interrupted"] is None:
        compact_shards(parts, out)
        shutil.rmtree(parts)
    return summary


def _check_leftover_matches(
    path: Path, saved: dict[str, Any], tool_names: list[str], tool_parser: str
) -> None:
    """The tools and tool-call format must be the leftover's: they shaped its tokens."""
    from toolrollout._exceptions import UserError

    if saved.get("tools") != tool_names:
        raise UserError(
            f"{path} was rolled out with tools {saved.get('tools')} but this run has "
            f"{tool_names}: pass the same --tool-config"
        )
    if saved.get("tool_parser") != tool_parser:
        raise UserError(
            f"{path} was rolled out with --tool-parser {saved.get('tool_parser')!r}, "
            f"not {tool_parser!r}"
        )


def _tokenizer_fingerprint(tokenizer: Any) -> str:
    """A hash of the vocabulary and chat template: equal means the token ids mean the same."""
    import hashlib

    digest = hashlib.sha256()
    digest.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    digest.update(str(getattr(tokenizer, "chat_template", None) or "").encode())
    return digest.hexdigest()[:16]


def _ray_options(ray: bool, workers: int, address: str | None) -> Any:
    """The ``--ray*`` options as RayOptions, or None for a one-machine run."""
    from toolrollout._exceptions import UserError

    if not ray:
        if address is not None:
            raise UserError("--ray-address needs --ray")
        return None
    from toolrollout.distributed import RayOptions

    if workers < 1:
        raise UserError(f"--ray-workers must be at least 1, got {workers}")
    return RayOptions(workers=workers, address=address)


def _http_timeout(seconds: float) -> Any:
    import httpx

    return httpx.Timeout(seconds, connect=min(seconds, 10.0))


_MANIFEST = "run.json"


def _open_run(parts: Path, *, dataset: Path, num_prompts: int, n: int, resume: bool) -> str:
    """Start or reopen the shard folder; returns the run id that makes group ids stable."""
    from toolrollout._exceptions import UserError

    identity = {
        "dataset": str(dataset.resolve()),
        "num_prompts": num_prompts,
        "n": n,
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
        return str(saved["run_id"])
    # */part-*: the worker folders of a `--ray` run (docs/scale-out.md)
    if any(parts.glob("part-*.parquet")) or any(parts.glob("*/part-*.parquet")):
        raise UserError(
            f"{parts} holds an unfinished run: pass --resume to complete it, or delete it"
        )
    parts.mkdir(parents=True, exist_ok=True)
    run_id = uuid.uuid4().hex[:8]
    manifest.write_text(json.dumps({"run_id": run_id, **identity}) + "\n", encoding="utf-8")
    return run_id


async def _watch_signals(engine: Any, interrupted: list[str], scope: Any) -> None:
    """On SIGINT/SIGTERM: stop taking rows, abort in-flight requests, cancel the run."""
    import anyio

    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            interrupted.append(signal.Signals(signum).name)
            with anyio.move_on_after(5.0):
                abort_all = getattr(engine, "abort_all", None)
                if abort_all is not None:
                    await abort_all()
                else:
                    engine.abort_nowait(abort_all=True)  # the embedded engine
            scope.cancel()
            return


def _summarise(trajectories: list[Any], elapsed: float) -> dict[str, Any]:
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
        "model_tokens": sum(int(t.metrics.get("model_tokens", 0)) for t in trajectories),
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
        ("mean reward", "-" if mean_reward is None else f"{mean_reward:.3f}"),
        ("mean turns", f"{summary['mean_turns']:.2f}"),
        ("tool calls", str(summary["tool_calls"])),
        ("tool errors", str(summary["tool_errors"])),
        ("parse errors", str(summary["parse_errors"])),
        ("drift mismatches", str(summary["drift"])),
        ("generated tokens/s", f"{summary['model_tokens'] / max(summary['seconds'], 1e-9):.1f}"),
        ("wall seconds", f"{summary['seconds']:.1f}"),
    ]
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
    app.command("generate")(generate)
