"""``toolrollout generate``: roll out a dataset and write trajectories to parquet.

With no options it runs the bundled demo end to end: the embedded engine with the demo
model, the demo prompts, the real calculator tool, numeric-match rewards, and writes
``trajectories.parquet``. Without ``--dataset`` the demo prompt set matching the configured
tools is used (``python`` tool: the python prompts, ``search`` tool: the search prompts,
anything else: the calculator prompts). User mistakes exit with a one-line message and code 2.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import typer

__all__ = ["generate", "register"]


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


def generate(
    engine_url: Annotated[
        list[str] | None,
        typer.Option(
            "--engine-url",
            help="SGLang-compatible server (repeatable). Default: the embedded engine.",
        ),
    ] = None,
    model: Annotated[
        Path | None,
        typer.Option(
            help="Model folder (embedded engine) or tokenizer folder of the served model. "
            "Default: the bundled demo model."
        ),
    ] = None,
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
    n: Annotated[int, typer.Option("--n", min=1, help="Samples per prompt (GRPO group).")] = 1,
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
) -> None:
    """Run multi-turn tool rollouts and write one row per trajectory."""
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
        )
    except ToolRolloutError as exc:
        raise _fail(str(exc)) from None
    except OSError as exc:
        raise _fail(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")) from None
    _print_summary(summary, out)


def _load_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    from toolrollout._exceptions import UserError

    if not path.is_dir():
        raise UserError(f"model folder not found: {path}")
    try:
        return AutoTokenizer.from_pretrained(str(path))
    except Exception as exc:  # transformers raises many types for a bad folder
        raise UserError(f"cannot load a tokenizer from {path}: {exc}") from exc


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
    n: int,
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
) -> dict[str, Any]:
    import anyio

    from toolrollout._exceptions import UserError
    from toolrollout.chat import tool_parser_names
    from toolrollout.data import load_prompts
    from toolrollout.demo import DEMO_MODEL_PATH, demo_prompts_for_tools
    from toolrollout.engines import Engine, SamplingParams, SGLangClient
    from toolrollout.interactions import load_interaction_config
    from toolrollout.rewards import RewardMix, exact_match, numeric_match
    from toolrollout.rewards import tool_error_penalty as penalty_term
    from toolrollout.rollout import RolloutConfig, RolloutRunner, Trajectory, TrajectoryWriter
    from toolrollout.rollout._interactions import select_interaction
    from toolrollout.tools import calculator_tool, load_tool_config, tool_services

    from ._progress import RolloutProgress

    if tool_parser not in tool_parser_names():
        raise UserError(
            f"unknown --tool-parser {tool_parser!r}; choose from {', '.join(tool_parser_names())}"
        )
    tools = load_tool_config(tool_config) if tool_config else [calculator_tool()]
    prompts_path = dataset or demo_prompts_for_tools(t.name for t in tools)
    prompts = load_prompts(prompts_path, limit=limit)
    interactions = load_interaction_config(interaction_config) if interaction_config else {}
    for index, prompt in enumerate(prompts):  # a row naming an unknown interaction: fail now
        try:
            select_interaction(interactions, prompt)
        except UserError as exc:
            raise UserError(f"{prompts_path} row {index}: {exc}") from exc
    model_path = model or DEMO_MODEL_PATH
    tokenizer = _load_tokenizer(model_path)
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
    )
    vision = None
    if (model_path / "preprocessor_config.json").is_file():
        # A vision-language model: tool images go into its context (docs/multimodal.md).
        from toolrollout.chat import VisionFormat

        vision = VisionFormat.from_pretrained(model_path)
    rewards: list[Any] = []
    truths = [p.ground_truth for p in prompts if p.ground_truth is not None]
    if truths:
        # Numbers compare as numbers ("The answer is 12.0"); other answers must match exactly.
        rewards.append(numeric_match if all(_is_number(t) for t in truths) else exact_match)
    if tool_error_penalty > 0:
        rewards.append(penalty_term(tool_error_penalty))

    async def main() -> dict[str, Any]:
        engine: Engine
        context_length: int | None
        if engine_urls:
            client = SGLangClient(engine_urls)
            engine = client
            await client.wait_healthy(timeout=health_timeout)
            info = await client.server_info()
            raw = info.get("context_length")
            context_length = int(raw) if isinstance(raw, int) else None
        else:
            from toolrollout.engines import EmbeddedEngine

            embedded = EmbeddedEngine(model_path, num_threads=threads)
            engine = embedded
            await embedded.start()
            context_length = embedded.context_length
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
            total = len(prompts) * n
            started = time.perf_counter()
            with TrajectoryWriter(out) as writer, RolloutProgress(total) as progress:

                def on_result(trajectory: Trajectory) -> None:
                    writer.write(trajectory)
                    progress.update(trajectory)

                trajectories = await runner.run(prompts, on_result=on_result)
            elapsed = time.perf_counter() - started
        return _summarise(trajectories, elapsed)

    return anyio.run(main)


def _is_number(value: object) -> bool:
    try:
        float(str(value).replace(",", ""))
    except ValueError:
        return False
    return True


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


def _print_summary(summary: dict[str, Any], out: Path) -> None:
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
    rows += [(f"status {k}", str(v)) for k, v in sorted(summary["statuses"].items())]
    for name, value in rows:
        table.add_row(name, value)
    Console().print(table)


def register(app: typer.Typer) -> None:
    """Add the ``generate`` command to the ``toolrollout`` app."""
    app.command("generate")(generate)
