"""Rollout orchestration on a real engine: toolrollout, lock-step, verifiers and the engine bound.

``toolrollout bench`` measures the client against a latency-model server; this script puts a
real server (SGLang or vLLM, found through the engine seam: ``connect``) under the same
comparison, with the demo model answering the demo's calculator prompts and a calculator
tool that takes a deterministic heavy-tailed latency (the same seconds for the same call in
every mode). Modes, each in its own worker process (its CPU time is its own):

* ``toolrollout``: ``RolloutRunner`` over the engine; every trajectory runs on its own.
* ``lockstep``: the same chat format, parser, engine and tool, turn-synchronous: every
  trajectory waits for the whole batch's generations, then the whole batch's tool calls.
* ``verifiers``: the published ``verifiers`` 0.2.0 ``ToolEnv`` over the server's
  ``/v1/chat/completions`` (the server renders the template and parses tool calls: start
  vLLM with ``--enable-auto-tool-choice --tool-call-parser hermes``); skipped when the
  package is missing.
* ``bound``: the engine-only bound. Every model turn toolrollout generated is submitted
  again (its exact input ids, its exact number of new tokens with ``ignore_eos``) by a bare
  loop over the engine, each trajectory's turns one after another, with no tool latency,
  no parsing and no rendering: what the server alone needs for the same generations.

Ratios, one run: ``toolrollout / bound`` (what tools and the client add over the engine),
``lockstep / toolrollout`` and ``verifiers / toolrollout`` (speed-ups). Client and server
share the machine's cores: pin them apart (``taskset``) and read the client CPU beside the
ratios; the load average before and after is recorded, since other work moves every number.

    python benchmarks/bench_real_engine.py --engine-url http://127.0.0.1:8000 \
        --out benchmarks/results/real_engine.json --plot docs/benchmarks_real_engine.png
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import anyio

MODES = ("toolrollout", "lockstep", "verifiers", "bound")


@dataclass(frozen=True)
class Config:
    engine_url: str
    model: str
    prompts: int
    n: int
    max_turns: int
    max_new_tokens: int
    temperature: float
    tool_median: float
    tool_sigma: float
    seed: int
    concurrency: int
    turns_file: str
    """Where the toolrollout worker writes its model turns for the bound to replay."""


def _latency(config: Config) -> Any:
    from toolrollout.apps.bench import ToolLatency

    return ToolLatency("lognormal", config.tool_median, config.tool_sigma, seed=config.seed)


def _rows(config: Config) -> list[dict[str, Any]]:
    from toolrollout.apps.demo import load_demo_prompts

    prompts = load_demo_prompts()
    rows = [prompts[i % len(prompts)] for i in range(config.prompts)]
    return [{"messages": row["messages"], "id": f"{row['id']}-{i}"} for i, row in enumerate(rows)]


async def _slow_calculator(latency: Any, expression: str) -> str:
    """The calculator after the call's deterministic latency (keyed by its expression)."""
    from toolrollout.tools.calculator import calculator

    await anyio.sleep(latency.sample(expression))
    return calculator(expression)


def _tool(config: Config) -> Any:
    """The demo's calculator (its schema) with the benchmark's tool latency."""
    from toolrollout.tools import FunctionTool
    from toolrollout.tools.calculator import CALCULATOR_TOOL

    latency = _latency(config)

    async def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression.

        Args:
            expression: Arithmetic with + - * / // % ** and parentheses.
        """
        return await _slow_calculator(latency, expression)

    return FunctionTool.from_function(calculator, name="calculator").with_schema(CALCULATOR_TOOL)


def _sampling(config: Config) -> Any:
    from toolrollout.engines import SamplingParams

    return SamplingParams(max_new_tokens=config.max_new_tokens, temperature=config.temperature)


def _usage() -> tuple[float, float]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), usage.ru_utime + usage.ru_stime


def _measured(started: tuple[float, float]) -> dict[str, float]:
    wall, cpu = _usage()
    return {"makespan_s": wall - started[0], "client_cpu_s": cpu - started[1]}


async def _engine(config: Config) -> Any:
    from toolrollout.engines import connection_limits
    from toolrollout.engines._factory import connect

    return await connect([config.engine_url], limits=connection_limits(config.concurrency))


async def run_toolrollout(config: Config, tokenizer: Any) -> dict[str, Any]:
    from toolrollout.rollout import RolloutConfig
    from toolrollout.spec import RunSpec, build_runner

    rollout = RolloutConfig(
        sampling=_sampling(config),
        max_turns=config.max_turns,
        n=config.n,
        concurrency=config.concurrency,
        seed=config.seed,
    )
    async with await _engine(config) as engine:
        spec = RunSpec(tools=(_tool(config),), config=rollout, rewards=(), vision="off")
        runner = build_runner(spec, engine, tokenizer=tokenizer)
        async with runner:
            started = _usage()
            trajectories = await runner.run(_rows(config))
            measured = _measured(started)
    turns: list[list[tuple[list[int], int]]] = []
    for t in trajectories:  # each model turn: (its input ids, its number of new tokens)
        ids, mask, runs, start = list(t.prompt_ids) + list(t.response_ids), t.loss_mask, [], 0
        offset = len(t.prompt_ids)
        while start < len(mask):
            if mask[start] != 1:
                start += 1
                continue
            end = start
            while end < len(mask) and mask[end] == 1:
                end += 1
            runs.append((ids[: offset + start], end - start))
            start = end
        turns.append(runs)
    return {
        "model_turns": turns,
        "trajectories": len(trajectories),
        "completed": sum(1 for t in trajectories if str(t.status) == "completed"),
        "turns": sum(t.num_turns for t in trajectories),
        "tool_calls": sum(t.num_tool_calls for t in trajectories),
        "generated_tokens": sum(int(t.metrics["model_tokens"]) for t in trajectories),
        "errors": sum(1 for t in trajectories if t.error),
        **measured,
    }


async def run_lockstep(config: Config, tokenizer: Any) -> dict[str, Any]:
    from toolrollout.chat import ChatFormat, get_tool_parser
    from toolrollout.engines import GenerateRequest, GenerateResult
    from toolrollout.tools import ToolCallRequest, ToolContext, ToolExecutor, ToolResult

    executor = ToolExecutor([_tool(config)])
    chat = ChatFormat(tokenizer, tools=executor.schemas())
    parser = get_tool_parser("qwen25")
    sampling = _sampling(config)
    rows = [row for row in _rows(config) for _ in range(config.n)]
    results: dict[int, GenerateResult] = {}
    outputs: dict[int, list[ToolResult]] = {}
    counts = {"turns": 0, "tokens": 0, "tool_calls": 0, "completed": 0}
    async with await _engine(config) as engine:

        async def generate(i: int, ids: list[int], turn: int) -> None:
            seeded = sampling.__class__(
                **{**asdict(sampling), "seed": config.seed + 7919 * i + turn}
            )
            request = GenerateRequest(
                ids, sampling=seeded, rid=f"ls{i}-t{turn}", session_id=f"ls{i}"
            )
            results[i] = await engine.generate(request)

        async def tools(i: int, calls: Sequence[ToolCallRequest]) -> None:
            outputs[i] = await executor.run_calls(calls, ToolContext(trajectory_id=str(i)))

        started = _usage()
        states = [
            ([dict(m) for m in row["messages"]], chat.render_prompt(row["messages"]))
            for row in rows
        ]
        live = set(range(len(states)))
        for turn in range(config.max_turns):
            if not live:
                break
            results.clear()
            async with anyio.create_task_group() as tg:  # barrier 1: every generation
                for i in sorted(live):
                    tg.start_soon(generate, i, states[i][1], turn)
            pending: list[tuple[int, list[ToolCallRequest]]] = []
            for i in sorted(live):
                messages, ids = states[i]
                result = results[i]
                ids.extend(result.output_ids)
                counts["turns"] += 1
                counts["tokens"] += len(result.output_ids)
                parsed = parser.parse(chat.model_text(result.output_ids))
                if not parsed.tool_calls or result.finish_reason.type != "stop":
                    live.discard(i)
                    counts["completed"] += result.finish_reason.type == "stop"
                    continue
                if turn == config.max_turns - 1:  # out of turns, as the runner ends it
                    live.discard(i)
                    continue
                calls = [
                    ToolCallRequest(name=c.name, arguments=c.arguments, id=c.id)
                    for c in parsed.tool_calls
                ]
                messages.append(
                    {
                        "role": "assistant",
                        "content": parsed.content,
                        "tool_calls": [
                            {
                                "id": c.id,
                                "type": "function",
                                "function": {"name": c.name, "arguments": c.arguments},
                            }
                            for c in parsed.tool_calls
                        ],
                    }
                )
                pending.append((i, calls))
            outputs.clear()
            async with anyio.create_task_group() as tg:  # barrier 2: every tool call
                for i, calls in pending:
                    tg.start_soon(tools, i, calls)
            for i, calls in pending:
                messages, ids = states[i]
                counts["tool_calls"] += len(calls)
                answers = [
                    {"role": "tool", "tool_call_id": c.id, "name": c.name, "content": r.text}
                    for c, r in zip(calls, outputs[i], strict=True)
                ]
                ids.extend(chat.tool_turn_delta(messages, answers))
                messages.extend(answers)
        measured = _measured(started)
    return {
        "trajectories": len(rows),
        "completed": counts["completed"],
        "turns": counts["turns"],
        "tool_calls": counts["tool_calls"],
        "generated_tokens": counts["tokens"],
        **measured,
    }


async def run_bound(config: Config, tokenizer: Any, recorded: Any = None) -> dict[str, Any]:
    """Toolrollout's own model turns again: exact inputs and lengths, no tools, no parsing."""
    from toolrollout.engines import GenerateRequest, SamplingParams

    tokens = 0

    async with await _engine(config) as engine:

        async def trajectory(i: int, turns: list[tuple[list[int], int]]) -> None:
            nonlocal tokens
            for turn, (ids, length) in enumerate(turns):
                sampling = SamplingParams(
                    max_new_tokens=length,
                    temperature=config.temperature,
                    ignore_eos=True,
                    seed=config.seed + turn,
                )
                result = await engine.generate(
                    GenerateRequest(ids, sampling=sampling, rid=f"b{i}-t{turn}", session_id=f"b{i}")
                )
                tokens += len(result.output_ids)

        started = _usage()
        async with anyio.create_task_group() as tg:
            for i, turns in enumerate(recorded):
                tg.start_soon(trajectory, i, turns)
        measured = _measured(started)
    return {
        "trajectories": len(recorded),
        "completed": len(recorded),
        "turns": sum(len(t) for t in recorded),
        "tool_calls": 0,
        "generated_tokens": tokens,
        **measured,
    }


async def run_verifiers(config: Config, tokenizer: Any) -> dict[str, Any]:
    import logging

    import verifiers as vf
    from datasets import Dataset
    from openai import AsyncOpenAI
    from verifiers.clients import OpenAIChatCompletionsClient

    logging.getLogger("verifiers").setLevel(logging.WARNING)
    latency = _latency(config)

    async def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression and return the result.

        Args:
            expression: Arithmetic with + - * / // % ** and parentheses, e.g. 3 * (4 + 5)
        """
        return await _slow_calculator(latency, expression)

    rows = [row for row in _rows(config) for _ in range(config.n)]
    inputs = [
        {"prompt": row["messages"], "example_id": i, "answer": ""} for i, row in enumerate(rows)
    ]
    env = vf.ToolEnv(
        tools=[calculator],
        max_turns=config.max_turns,
        score_rollouts=False,
        dataset=Dataset.from_list(inputs),
    )
    openai_client = AsyncOpenAI(
        base_url=f"{config.engine_url}/v1", api_key="unused", max_retries=0, timeout=600.0
    )
    served = (await openai_client.models.list()).data[0].id
    sampling = {"max_tokens": config.max_new_tokens, "temperature": config.temperature}
    started = _usage()
    results = await env.generate(
        inputs,
        client=OpenAIChatCompletionsClient(openai_client),
        model=served,
        sampling_args=sampling,
        max_concurrent=-1,
        on_start=lambda *args: None,
        on_progress=lambda *args: None,
    )
    measured = _measured(started)
    await openai_client.close()
    outputs = results["outputs"]

    def role(m: Any) -> Any:
        return m.get("role") if isinstance(m, dict) else getattr(m, "role", None)

    turns = sum(
        sum(1 for m in (o.get("completion") or []) if role(m) == "assistant") for o in outputs
    )
    tools = sum(sum(1 for m in (o.get("completion") or []) if role(m) == "tool") for o in outputs)
    usage = [o.get("token_usage") or {} for o in outputs]
    return {
        "trajectories": len(outputs),
        "completed": sum(1 for o in outputs if o.get("is_completed") and not o.get("error")),
        "turns": turns,
        "tool_calls": tools,
        "generated_tokens": sum(
            int(u.get("output_tokens", u.get("completion_tokens", 0)) or 0) for u in usage
        ),
        "errors": sum(1 for o in outputs if o.get("error")),
        **measured,
        "note": f"verifiers {getattr(vf, '__version__', '?')} ToolEnv over /v1/chat/completions",
    }


def worker(mode: str, config: Config) -> dict[str, Any]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(config.model)
    run = {
        "toolrollout": run_toolrollout,
        "lockstep": run_lockstep,
        "verifiers": run_verifiers,
        "bound": run_bound,
    }[mode]
    if mode == "bound":
        recorded = json.loads(Path(config.turns_file).read_text())
        result: dict[str, Any] = anyio.run(run_bound, config, tokenizer, recorded)
    else:
        result = anyio.run(run, config, tokenizer)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


def _machine() -> dict[str, Any]:
    return {
        "load_average": list(os.getloadavg()),
        "client_cpus": sorted(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _server(url: str) -> dict[str, Any]:
    import httpx

    out: dict[str, Any] = {"url": url}
    for path in ("/version", "/server_info"):
        try:
            answer = httpx.get(url + path, timeout=10.0)
        except httpx.HTTPError:
            continue
        if answer.status_code == 200 and path == "/version":
            out["vllm_version"] = answer.json().get("version")
        elif answer.status_code == 200:
            out["sglang_version"] = answer.json().get("version")
    return out


def ratios(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    span = {m: r["makespan_s"] for m, r in results.items() if "makespan_s" in r}
    out: dict[str, float] = {}
    if "toolrollout" in span and "bound" in span:
        out["toolrollout_over_bound"] = span["toolrollout"] / span["bound"]
    for other in ("lockstep", "verifiers"):
        if other in span and "toolrollout" in span:
            out[f"{other}_over_toolrollout"] = span[other] / span["toolrollout"]
    return out


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = report["results"]
    modes = [m for m in MODES if m in results and "makespan_s" in results[m]]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4))
    left.bar(modes, [results[m]["makespan_s"] for m in modes], color="tab:blue")
    left.set_ylabel("makespan (s)")
    left.set_title(f"{report['engine']} : {report['workload']['trajectories']} trajectories")
    right.bar(modes, [results[m]["client_cpu_s"] for m in modes], color="tab:orange")
    right.set_ylabel("client CPU (s)")
    right.set_title(f"load average {report['machine_before']['load_average'][0]:.1f}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine-url", required=True)
    parser.add_argument("--model", default=None, help="tokenizer folder (default: the demo model)")
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--n", type=int, default=2)
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--tool-median", type=float, default=0.5)
    parser.add_argument("--tool-sigma", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=1024)
    parser.add_argument("--mode", action="append", choices=MODES)
    parser.add_argument("--out", type=Path, default=Path("bench_real_engine.json"))
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, Config(**json.loads(args.config)))))
        return
    if args.model is None:
        from toolrollout.apps.demo import DEMO_MODEL_PATH

        args.model = str(DEMO_MODEL_PATH)
    modes = tuple(args.mode or MODES)
    if "bound" in modes and "toolrollout" not in modes:
        parser.error("--mode bound replays the toolrollout mode's turns: run both")
    turns_file = Path(args.out).with_suffix(".turns.json")
    config = Config(
        args.engine_url.rstrip("/"), args.model, args.prompts, args.n, args.max_turns,
        args.max_new_tokens, args.temperature, args.tool_median, args.tool_sigma, args.seed,
        args.concurrency, str(turns_file),
    )  # fmt: skip
    report: dict[str, Any] = {
        "engine": "",
        "server": _server(config.engine_url),
        "workload": {**asdict(config), "trajectories": config.prompts * config.n},
        "machine_before": _machine(),
        "results": {},
    }
    report["engine"] = "vLLM" if "vllm_version" in report["server"] else "SGLang"
    for mode in sorted(modes, key=MODES.index):  # toolrollout before the bound that replays it
        if mode == "verifiers":
            import importlib.util

            if importlib.util.find_spec("verifiers") is None:
                report["results"][mode] = {"skipped": "verifiers is not installed"}
                continue
        print(f"{mode} ...", file=sys.stderr, flush=True)
        done = subprocess.run(
            [sys.executable, __file__, "--engine-url", config.engine_url, "--worker", mode,
             "--config", json.dumps(asdict(config))],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(f"mode {mode} failed:\n{done.stderr[-4000:]}")
        report["results"][mode] = json.loads(done.stdout.strip().splitlines()[-1])
        if mode == "toolrollout":  # what the bound replays
            turns_file.write_text(json.dumps(report["results"][mode].pop("model_turns")))
        print(f"{mode}: {report['results'][mode]}", file=sys.stderr, flush=True)
    turns_file.unlink(missing_ok=True)
    report["machine_after"] = _machine()
    report["ratios"] = ratios(report["results"])
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    if args.plot is not None:
        plot(report, args.plot)
    print(json.dumps(report["ratios"], indent=2))


if __name__ == "__main__":
    main()
