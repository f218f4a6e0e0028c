"""The latency-model comparison's drivers, each run alone in a worker process (``_worker``).

``toolrollout`` runs :class:`~toolrollout.rollout.RolloutRunner`, every trajectory on its
own; ``oversample`` its ``run_batch`` to a target of ``batch_fraction``, the rest aborted
(and kept, resumable); ``lockstep`` the same parts turn-synchronously, as TRL's tool loop;
``verifiers`` the published peer library (``_verifiers``). The bare POST modes are the
client-CPU floors of a turn: ``httpx``, ``aiohttp`` (toolrollout's own transport, to tell
what it saves from what toolrollout adds) and ``aiohttp+tool`` (plus each turn's tool call).
"""

from __future__ import annotations

import gc
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio

from toolrollout._exceptions import UserError
from toolrollout._pacing import set_pacing

from ._harness import reset_services
from ._metrics import clock, since
from ._model import DriverSpec, Workload, worker_flags
from ._tools import LookupClient
from ._verifiers import run_verifiers

if TYPE_CHECKING:  # the rollout package pulls in transformers; the worker imports it lazily
    from toolrollout.chat import ParsedTurn
    from toolrollout.engines import Engine, GenerateResult, SamplingParams, SGLangClient
    from toolrollout.rollout import RolloutConfig, RolloutRunner, Trajectory
    from toolrollout.tools import Tool, ToolCallRequest, ToolResult

__all__ = ["lag_summary", "lockstep_rollout", "run_driver"]


LAG_INTERVAL_S = 0.01
"""The lag monitor's sleep: each wake-up's lateness beyond it is one lag sample."""


async def _watch_lag(samples: list[tuple[float, float]]) -> None:
    """Sleep ``LAG_INTERVAL_S`` again and again; record (wake-up time, ms late) each time.

    The lateness is how long every other ready callback of the loop waited too: a loop busy
    parsing answers or rendering templates delays every trajectory's next step by as much.
    """
    while True:
        before = time.perf_counter()
        await anyio.sleep(LAG_INTERVAL_S)
        after = time.perf_counter()
        samples.append((after, max(0.0, (after - before - LAG_INTERVAL_S) * 1000.0)))


def lag_summary(
    samples: Sequence[tuple[float, float]], start: float, end: float
) -> dict[str, float]:
    """p50 / p99 / max of the lag samples whose wake-up fell in ``[start, end]`` (ms)."""
    from toolrollout.tools._limits import quantile  # lazily, as the drivers import tools

    values = sorted(lag for at, lag in samples if start <= at <= end)
    if not values:
        return {"samples": 0, "p50": 0.0, "p99": 0.0, "max": 0.0}
    p50, p99 = quantile(values, 0.50), quantile(values, 0.99)
    return {"samples": len(values), "p50": p50, "p99": p99, "max": values[-1]}


def _rollout_config(spec: DriverSpec, workload: Workload) -> RolloutConfig:
    """The RolloutConfig both toolrollout modes run with."""
    from toolrollout.engines import SamplingParams, SchedulingConfig
    from toolrollout.rollout import RolloutConfig

    flags = worker_flags(spec.policies)
    scheduling = SchedulingConfig.from_names(
        ",".join(flags.scheduling),
        group_key="group",
        history_key="group",  # the prompt's id, the same at every step
    )
    concurrency = spec.concurrency  # admission adapts below it (its ceiling)
    return RolloutConfig(
        sampling=SamplingParams(max_new_tokens=workload.max_new_tokens, temperature=1.0),
        max_turns=workload.max_turns,
        n=workload.samples_per_row,
        tools_at_target="finish" if flags.finish_tools else "cancel",
        max_response_tokens=1_000_000,
        concurrency=concurrency,
        drift_check=spec.drift_check,
        scheduling=scheduling,
    )


def _engine_client(spec: DriverSpec) -> SGLangClient:
    """Every mode's engine client, its pool sized to the run's concurrency as the
    composition root sizes it (:meth:`RunSpec.client_options`)."""
    from toolrollout.engines import SGLangClient, connection_limits

    return SGLangClient(list(spec.engine_urls), limits=connection_limits(spec.concurrency))


def _rows(spec: DriverSpec, workload: Workload) -> list[dict[str, Any]]:
    """The rows toolrollout runs (``n`` samples each, :attr:`Workload.samples_per_row`);
    with a scheduling policy each row names its GRPO group (``group``)."""
    rows = workload.prompt_rows()
    if spec.policies:
        if workload.grouped:
            groups = [group.key for group in workload.groups()]
        else:
            groups = [item.group for item in workload.items]
        for row, group in zip(rows, groups, strict=True):
            row["group"] = group
    return rows


@asynccontextmanager
async def _runner(
    spec: DriverSpec, workload: Workload, tokenizer: Any
) -> AsyncIterator[RolloutRunner]:
    """A toolrollout runner over the lookup tool and the engine client, both closed after."""
    from toolrollout.spec import RunSpec, build_runner

    lookup = LookupClient(spec.tool_url)
    config = _rollout_config(spec, workload)
    async with _engine_client(spec) as client:
        run_spec = RunSpec(tools=(lookup.tool(),), config=config, rewards=(), vision="off")
        yield build_runner(run_spec, client, tokenizer=tokenizer)
    await lookup.aclose()


async def _run_toolrollout(spec: DriverSpec, workload: Workload, tokenizer: Any) -> dict[str, Any]:
    async with _runner(spec, workload, tokenizer) as runner:
        first = workload.step - spec.previous_steps
        for step in range(first, workload.step):  # a trainer's earlier steps
            await runner.run(_rows(spec, replace(workload, step=step)))
        if spec.previous_steps:  # only the measured step's work is logged and bounded
            await anyio.to_thread.run_sync(reset_services, spec.engine_urls, spec.tool_url)
        rows = _rows(spec, workload)
        known = runner.work_history.statistics() if runner.work_history is not None else {}
        started = clock()
        trajectories = await runner.run(rows)
        measured = since(started)
    history = None
    if runner.work_history is not None:  # the measured step's predictions, by source
        after = runner.work_history.statistics()
        history = {k: v if k == "prompts" else v - known[k] for k, v in after.items()}
    drift = sum(int(t.metrics.get("drift_mismatches", 0)) for t in trajectories)
    policies = "+".join(spec.policies) or "none"
    return {
        "trajectories": len(trajectories),
        "completed": sum(1 for t in trajectories if str(t.status) == "completed"),
        "turns": sum(t.num_turns for t in trajectories),
        "generated_tokens": sum(int(t.metrics["model_tokens"]) for t in trajectories),
        "cached_tokens": sum(int(t.metrics["cached_tokens"]) for t in trajectories),
        **measured,
        "note": (
            f"policies {policies}; drift mismatches {drift}; errors "
            + str(sum(1 for t in trajectories if t.error))
            + (f"; previous steps {spec.previous_steps}" if spec.previous_steps else "")
            + (f"; history {history}" if history is not None else "")
        ),
    }


async def _run_oversample(spec: DriverSpec, workload: Workload, tokenizer: Any) -> dict[str, Any]:
    """Straggler control: stop at ``batch_fraction`` of the groups, abort the rest.

    With a :attr:`~Workload.grouped` workload the target counts whole GRPO groups (every
    sample of the prompt finished), as a trainer's batch does. Otherwise every trajectory
    is its own row and its own group (the samples have distinct prompts), so the target
    counts trajectories. ``trajectories`` is what the batch delivered; the turns and tokens
    include the aborted ones' (their CPU was spent too).
    """
    import math

    # Ungrouped, each row is its own group for the scheduler too, as the target counts it.
    rows = _rows(spec, workload) if workload.grouped else workload.rows()
    target = min(len(rows), max(1, math.ceil(len(rows) * spec.batch_fraction)))
    async with _runner(spec, workload, tokenizer) as runner:
        ended: dict[str, float] = {}

        def note_end(trajectory: Trajectory) -> None:
            ended[trajectory.uid] = time.perf_counter()

        started = clock()
        batch = await runner.run_batch(rows, target_groups=target, on_result=note_end)
        measured = since(started)
    # The target was met when the batch's last trajectory ended; the rest is the stopping.
    target_s = max((ended[t.uid] for t in batch.trajectories), default=started[0]) - started[0]
    everything = [*batch.trajectories, *batch.leftover]
    return {
        "trajectories": len(batch.trajectories),
        "completed": sum(1 for t in batch.trajectories if str(t.status) == "completed"),
        "turns": sum(t.num_turns for t in everything),
        "generated_tokens": sum(int(t.metrics["model_tokens"]) for t in everything),
        **measured,
        "target_s": target_s,
        "note": (
            f"batch target {target} of {len(rows)} "
            f"{'groups' if workload.grouped else 'trajectories'}; "
            f"{len(batch.partial)} aborted at the target, resumable"
        ),
    }


@dataclass(slots=True)
class _LockstepState:
    messages: list[dict[str, Any]]
    ids: list[int]
    turns: int = 0
    tokens: int = 0
    cached: int = 0
    done: bool = False
    completed: bool = False

    def take(self, result: GenerateResult, parsed: ParsedTurn, last: bool) -> list[ToolCallRequest]:
        """Add a model turn; the tool calls to run before the next (none: it is done)."""
        from toolrollout.tools import ToolCallRequest

        self.ids.extend(result.output_ids)
        self.turns += 1
        self.tokens += len(result.output_ids)
        self.cached += result.cached_tokens
        stopped = result.finish_reason.type == "stop"
        if not parsed.tool_calls or not stopped or last:
            self.done = True  # answered, cut off, or out of turns (as the runner ends it)
            self.completed = stopped and not parsed.tool_calls
            return []
        calls = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in parsed.tool_calls
        ]
        self.messages.append({"role": "assistant", "content": parsed.content, "tool_calls": calls})
        return [
            ToolCallRequest(name=c.name, arguments=c.arguments, id=c.id) for c in parsed.tool_calls
        ]


async def _run_lockstep(spec: DriverSpec, workload: Workload, tokenizer: Any) -> dict[str, Any]:
    from toolrollout.engines import SamplingParams

    lookup = LookupClient(spec.tool_url)
    sampling = SamplingParams(max_new_tokens=workload.max_new_tokens, temperature=1.0)
    async with _engine_client(spec) as client:
        started = clock()
        counts = await lockstep_rollout(
            client, tokenizer, lookup.tool(), workload.rows(), sampling, workload.max_turns
        )
        measured = since(started)
    await lookup.aclose()
    tool_errors = counts.pop("tool_errors")
    return {
        **counts,
        **measured,
        "note": f"turn-synchronous batches (TRL-style); tool errors {tool_errors}",
    }


async def lockstep_rollout(
    client: Engine,
    tokenizer: Any,
    tool: Tool,
    rows: Sequence[Mapping[str, Any]],
    sampling: SamplingParams,
    max_turns: int,
) -> dict[str, int]:
    """Turn-synchronous rollouts (how TRL's built-in tool loop proceeds): every trajectory
    waits for the whole batch's generations, then for the whole batch's tool calls, before
    its next turn. The same chat format, parser, engine and tool as toolrollout's; both
    comparisons run it. Returns the counts (trajectories, completed, turns, tool calls and
    errors, generated and cached tokens)."""
    from toolrollout.chat import ChatFormat
    from toolrollout.chat.parsers import get_tool_parser
    from toolrollout.engines import GenerateRequest
    from toolrollout.tools import ToolContext, ToolExecutor

    executor = ToolExecutor([tool])
    chat = ChatFormat(tokenizer, tools=executor.schemas())
    parser = get_tool_parser("qwen25")
    results: dict[int, GenerateResult] = {}
    outputs: dict[int, list[ToolResult]] = {}

    async def generate(i: int, state: _LockstepState, turn: int) -> None:
        request = GenerateRequest(
            input_ids=state.ids, sampling=sampling, rid=f"ls{i}-t{turn}", session_id=f"ls{i}"
        )
        results[i] = await client.generate(request)

    async def tools(i: int, calls: Sequence[ToolCallRequest]) -> None:
        outputs[i] = await executor.run_calls(calls, ToolContext(trajectory_id=str(i)))

    tool_calls = tool_errors = 0
    states = [
        _LockstepState([dict(m) for m in row["messages"]], chat.render_prompt(row["messages"]))
        for row in rows
    ]
    for turn in range(max_turns):
        active = [(i, s) for i, s in enumerate(states) if not s.done]
        if not active:
            break
        results.clear()
        async with anyio.create_task_group() as tg:  # barrier 1: every generation
            for i, state in active:
                tg.start_soon(generate, i, state, turn)
        pending: list[tuple[int, _LockstepState, list[ToolCallRequest]]] = []
        for i, state in active:
            parsed = parser.parse(chat.model_text(results[i].output_ids))
            calls = state.take(results[i], parsed, last=turn == max_turns - 1)
            if calls:
                pending.append((i, state, calls))
        outputs.clear()
        async with anyio.create_task_group() as tg:  # barrier 2: every tool call
            for i, _, calls in pending:
                tg.start_soon(tools, i, calls)
        for i, state, calls in pending:
            tool_calls += len(calls)
            tool_errors += sum(1 for r in outputs[i] if r.is_error)
            answers = [
                {"role": "tool", "tool_call_id": c.id, "name": c.name, "content": r.text}
                for c, r in zip(calls, outputs[i], strict=True)
            ]
            state.ids.extend(chat.tool_turn_delta(state.messages, answers))
            state.messages.extend(answers)
    return {
        "trajectories": len(states),
        "completed": sum(1 for s in states if s.completed),
        "turns": sum(s.turns for s in states),
        "tool_calls": tool_calls,
        "tool_errors": tool_errors,
        "generated_tokens": sum(s.tokens for s in states),
        "cached_tokens": sum(s.cached for s in states),
    }


async def _run_httpx(
    spec: DriverSpec,
    workload: Workload,
    tokenizer: Any,
    *,
    fast: bool = False,
    with_tool: bool = False,
) -> dict[str, Any]:
    """Bare POSTs: the same conversations' ``/generate`` calls, nothing else (``with_tool``:
    plus each turn's tool call, as a bare ``LookupClient`` call, except after the last)."""
    import httpx

    from toolrollout._http import fast_transport
    from toolrollout.chat import ChatFormat
    from toolrollout.engines import connection_limits

    if workload.grouped:
        raise UserError(
            "the bare POST modes follow each sample's own script and need a workload whose "
            "samples have their own prompts (grouped=False)"
        )
    chat = ChatFormat(tokenizer, tools=[LookupClient(spec.tool_url).tool().schema()])
    prompts = [chat.render_prompt(row["messages"]) for row in workload.rows()]
    # A fixed stand-in for the tool turn, tokenized once outside the measured loop.
    filler = chat.encode(
        "\n<|im_start|>user\n<tool_response>\nrecord\n</tool_response><|im_end|>\n"
    )
    filler += chat.encode("<|im_start|>assistant\n")
    urls = spec.engine_urls  # trajectory i stays on server i mod N, like sticky routing
    stats = {"turns": 0, "tokens": 0, "completed": 0}
    limits = connection_limits(spec.concurrency)  # the engine client's pool, like for like
    transport = fast_transport(limits) if fast else None
    lookup = LookupClient(spec.tool_url)
    async with httpx.AsyncClient(timeout=600.0, limits=limits, transport=transport) as http:
        started = clock()

        async def one(i: int, item_turns: int) -> None:
            ids = list(prompts[i])
            url = urls[i % len(urls)]
            for turn in range(item_turns):
                body = {
                    "input_ids": ids,
                    "sampling_params": {"max_new_tokens": workload.max_new_tokens},
                    "return_logprob": True,
                    "rid": f"bare{i}-t{turn}",
                }
                response = await http.post(f"{url}/generate", json=body)
                response.raise_for_status()
                out = response.json()["output_ids"]
                stats["turns"] += 1
                stats["tokens"] += len(out)
                ids = ids + out + filler
                if with_tool and turn < item_turns - 1:
                    await lookup.lookup(workload.items[i].tool_keys()[turn])
            stats["completed"] += 1

        async with anyio.create_task_group() as tg:
            for i, item in enumerate(workload.items):
                tg.start_soon(one, i, item.turns)
        measured = since(started)
    await lookup.aclose()
    return {
        "trajectories": workload.trajectories,
        "completed": stats["completed"],
        "turns": stats["turns"],
        "generated_tokens": stats["tokens"],
        **measured,
        "note": (
            "bare httpx POST /generate per turn over "
            + ("toolrollout's aiohttp transport" if fast else "httpx's own transport")
            + ("; a bare tool call per turn" if with_tool else "; no tools")
            + ", no tokenization"
        ),
    }


_Driver = Callable[[DriverSpec, Workload, Any], Awaitable[dict[str, Any]]]
_DRIVERS: dict[str, _Driver] = {
    "toolrollout": _run_toolrollout,
    "oversample": _run_oversample,
    "lockstep": _run_lockstep,
    "httpx": _run_httpx,
    "aiohttp": partial(_run_httpx, fast=True),
    "aiohttp+tool": partial(_run_httpx, fast=True, with_tool=True),
    "verifiers": run_verifiers,
}


async def run_driver(spec: DriverSpec) -> dict[str, Any]:
    """Run one driver over the workload; its raw counts and wall-clock makespan."""
    from transformers import AutoTokenizer

    driver = _DRIVERS.get(spec.mode.split(":", 1)[0])
    if driver is None:
        raise ValueError(f"unknown benchmark mode {spec.mode!r}; choose from {sorted(_DRIVERS)}")
    workload = Workload(**spec.workload)
    flags = worker_flags(spec.policies)  # this worker process only
    set_pacing(flags.paced)
    if flags.gc_threshold is not None:
        gc.set_threshold(flags.gc_threshold, *gc.get_threshold()[1:])
    tokenizer = AutoTokenizer.from_pretrained(spec.tokenizer)
    samples: list[tuple[float, float]] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(_watch_lag, samples)
        result = await driver(spec, workload, tokenizer)
        tg.cancel_scope.cancel()
    # Only the measured run counts (not the tokenizer's load or the previous steps).
    until = float(result.pop("measured_until"))
    result["lag_ms"] = lag_summary(samples, until - float(result["makespan_s"]), until)
    return result
