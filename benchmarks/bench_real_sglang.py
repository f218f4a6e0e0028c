"""Rollout orchestration on a real SGLang server: toolrollout, lock-step, verifiers and the
engine-only bound, in one run, as ratios.

    python benchmarks/bench_real_sglang.py      # writes bench_real_sglang.json and .png here
    python benchmarks/bench_real_sglang.py --out benchmarks/results/real_sglang.json \\
        --plot docs/benchmarks_real_sglang.png  # refreshes the published files

One real SGLang server (PyPI's sglang in ``.engines/sglang``, built by ``.ci/sglang.sh``;
started by the test suite's launcher, float32, ``--tool-call-parser qwen25`` for
verifiers' chat route) serves the bundled demo model. Every mode rolls out the same demo
prompts greedily (temperature 0, so every mode asks for the same generations) with the
real calculator behind a tool latency drawn per expression (``ToolLatency``: the same
call waits as long in every mode):

* ``toolrollout``: ``RolloutRunner`` over ``SGLangClient``; it records every model turn
  (the ids before it and its length) for the bound below;
* ``lockstep``: the bench package's turn-synchronous driver (TRL's tool loop);
* ``verifiers``: verifiers 0.2.0's ``ToolEnv`` over the server's ``/v1/chat/completions``,
  run from its own virtualenv (``--verifiers-python``; it would downgrade the project's
  ``datasets``): ``python -m venv .engines/verifiers && .engines/verifiers/bin/pip install
  verifiers==0.2.0``. Left out, with a note, when that interpreter is missing;
* ``engine-only``: a minimal driver that resubmits toolrollout's recorded turns (each with
  ``max_new_tokens`` its recorded length and ``ignore_eos``), each trajectory's turns one
  after the other, with no tool latency, no tokenization and no parsing: the makespan the
  engine alone needs for the same generations.

Client and server share the machine's cores, so the server's process group (HTTP server,
scheduler, detokenizer, every thread) is pinned to ``--server-core`` and each mode's
worker process to ``--client-core`` (``sched_setaffinity``); each mode's client CPU
seconds and the server's CPU seconds are reported beside the ratios, and the load average
before and after each mode is recorded (other work on the machine shows there).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast

REPO = Path(__file__).resolve().parents[1]
MODES = ("toolrollout", "lockstep", "verifiers", "engine-only")
Turns = list[list[tuple[list[int], int]]]
"""Per trajectory, its model turns: the ids before the turn and how many the turn made."""


# ---------------------------------------------------------------- the workers (one per mode)


def _tool(median: float, sigma: float) -> Any:
    """The demo's calculator (its schema, so the prompt renders as the demo's), after a
    latency drawn from the expression."""
    import anyio

    from toolrollout.apps.bench import ToolLatency
    from toolrollout.tools import FunctionTool
    from toolrollout.tools.calculator import CALCULATOR_TOOL, calculator

    latency = ToolLatency(median=median, sigma=sigma)

    async def slow_calculator(expression: str) -> str:
        await anyio.sleep(latency.sample(expression))
        return calculator(expression)

    return FunctionTool.from_function(slow_calculator, name="calculator").with_schema(
        CALCULATOR_TOOL
    )


def _clock() -> tuple[float, float]:
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), usage.ru_utime + usage.ru_stime


def _since(start: tuple[float, float]) -> dict[str, float]:
    wall, cpu = _clock()
    return {"makespan_s": wall - start[0], "client_cpu_s": cpu - start[1]}


async def _worker_toolrollout(cfg: dict[str, Any], url: str, recorded: Turns) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from toolrollout.apps.bench import ToolLatency
    from toolrollout.apps.demo import DEMO_MODEL_PATH, load_demo_prompts
    from toolrollout.engines import SamplingParams, SGLangClient, connection_limits
    from toolrollout.rollout import RolloutConfig
    from toolrollout.spec import RunSpec, build_runner

    tokenizer = AutoTokenizer.from_pretrained(str(DEMO_MODEL_PATH))
    config = RolloutConfig(
        sampling=SamplingParams(max_new_tokens=cfg["max_new_tokens"], temperature=0.0),
        max_turns=cfg["max_turns"],
        concurrency=cfg["concurrency"],
    )
    tool = _tool(cfg["tool_median"], cfg["tool_sigma"])
    rows = load_demo_prompts()[: cfg["prompts"]]
    async with SGLangClient(url, limits=connection_limits(cfg["concurrency"])) as client:
        runner = build_runner(
            RunSpec(tools=(tool,), config=config, rewards=(), vision="off"),
            client,
            tokenizer=tokenizer,
        )
        started = _clock()
        trajectories = await runner.run(rows)
        measured = _since(started)
    latency = ToolLatency(median=cfg["tool_median"], sigma=cfg["tool_sigma"])
    chains = [_tool_chain_s(t.messages, latency) for t in trajectories]
    turns: Turns = []
    for t in trajectories:
        ids, mine = list(t.prompt_ids), []
        for span in t.spans:
            if span.kind == "model":
                mine.append((list(ids), len(span.ids)))
            ids.extend(span.ids)
        turns.append(mine)
    return {
        "recorded_turns": turns,
        "trajectories": len(trajectories),
        "completed": sum(1 for t in trajectories if str(t.status) == "completed"),
        "turns": sum(t.num_turns for t in trajectories),
        "tool_calls": sum(t.num_tool_calls for t in trajectories),
        "generated_tokens": sum(int(t.metrics["model_tokens"]) for t in trajectories),
        "failed": sum(1 for t in trajectories if t.failed),
        "longest_tool_chain_s": max(chains, default=0.0),
        **measured,
    }


def _tool_chain_s(messages: Any, latency: Any) -> float:
    """Seconds one trajectory's own tool calls wait in a row (its calls of a turn run at
    once): no client can finish it sooner, however fast the engine."""
    total = 0.0
    for message in messages:
        waits = [
            latency.sample(json.loads(call["function"]["arguments"]).get("expression", ""))
            if isinstance(call["function"]["arguments"], str)
            else latency.sample(call["function"]["arguments"].get("expression", ""))
            for call in message.get("tool_calls") or ()
        ]
        total += max(waits, default=0.0)
    return total


async def _worker_lockstep(cfg: dict[str, Any], url: str, recorded: Turns) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from toolrollout.apps.bench._drivers import lockstep_rollout
    from toolrollout.apps.demo import DEMO_MODEL_PATH, load_demo_prompts
    from toolrollout.engines import SamplingParams, SGLangClient, connection_limits

    tokenizer = AutoTokenizer.from_pretrained(str(DEMO_MODEL_PATH))
    sampling = SamplingParams(max_new_tokens=cfg["max_new_tokens"], temperature=0.0)
    tool = _tool(cfg["tool_median"], cfg["tool_sigma"])
    rows = load_demo_prompts()[: cfg["prompts"]]
    async with SGLangClient(url, limits=connection_limits(cfg["concurrency"])) as client:
        started = _clock()
        counts = await lockstep_rollout(client, tokenizer, tool, rows, sampling, cfg["max_turns"])
        measured = _since(started)
    return {**counts, **measured}


async def _worker_engine_only(cfg: dict[str, Any], url: str, recorded: Turns) -> dict[str, Any]:
    """toolrollout's recorded turns resubmitted as bare POSTs, no tool wait between them."""
    import anyio
    import httpx

    turns = recorded
    limit = anyio.Semaphore(cfg["concurrency"])  # toolrollout's in-flight limit
    stats = {"turns": 0, "generated_tokens": 0}
    async with httpx.AsyncClient(timeout=600.0) as http:

        async def one(i: int, mine: list[tuple[list[int], int]]) -> None:
            for k, (ids, length) in enumerate(mine):
                body = {
                    "input_ids": ids,
                    "sampling_params": {
                        "max_new_tokens": length,
                        "temperature": 0.0,
                        "ignore_eos": True,
                    },
                    "return_logprob": True,
                    "rid": f"bound{i}-t{k}",
                }
                async with limit:
                    response = await http.post(f"{url}/generate", json=body)
                response.raise_for_status()
                stats["turns"] += 1
                stats["generated_tokens"] += len(response.json()["output_ids"])

        started = _clock()
        async with anyio.create_task_group() as tg:
            for i, mine in enumerate(turns):
                tg.start_soon(one, i, mine)
        measured = _since(started)
    return {"trajectories": len(turns), "completed": len(turns), **stats, **measured}


async def _worker_verifiers(cfg: dict[str, Any], url: str, recorded: Turns) -> dict[str, Any]:
    """verifiers' ToolEnv over /v1/chat/completions (in verifiers' own virtualenv)."""
    import logging

    import httpx
    import verifiers as vf
    from datasets import Dataset
    from openai import AsyncOpenAI
    from verifiers.clients import OpenAIChatCompletionsClient

    from toolrollout.apps.bench import ToolLatency
    from toolrollout.apps.demo import load_demo_prompts
    from toolrollout.tools.calculator import calculator as calculate

    logging.getLogger("verifiers").setLevel(logging.WARNING)
    latency = ToolLatency(median=cfg["tool_median"], sigma=cfg["tool_sigma"])

    async def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression and return the result.

        Args:
            expression: Arithmetic with + - * / // % ** and parentheses, e.g. 3 * (4 + 5)
        """
        import asyncio

        await asyncio.sleep(latency.sample(expression))
        return calculate(expression)

    rows = load_demo_prompts()[: cfg["prompts"]]
    inputs = [
        {"prompt": list(r["messages"]), "example_id": i, "answer": ""} for i, r in enumerate(rows)
    ]
    env = vf.ToolEnv(
        tools=[calculator],
        max_turns=cfg["max_turns"],
        score_rollouts=False,
        dataset=Dataset.from_list(inputs),
    )
    openai_client = AsyncOpenAI(
        base_url=f"{url}/v1",
        api_key="unused",
        max_retries=0,
        # openai 3.x types this as httpx2's client; httpx's, which it also drives, is the one
        # the published run used
        http_client=cast(Any, httpx.AsyncClient(transport=_openai_metadata(), timeout=600.0)),
    )
    client = OpenAIChatCompletionsClient(openai_client)
    started = _clock()
    results = await env.generate(
        inputs,
        client=client,
        model="default",
        sampling_args={"max_tokens": cfg["max_new_tokens"], "temperature": 0.0},
        max_concurrent=cfg["concurrency"],
        on_start=lambda *args: None,
        on_progress=lambda *args: None,
    )
    measured = _since(started)
    await openai_client.close()
    outputs = results["outputs"]
    turns = calls = tokens = errors = 0
    for output in outputs:
        for message in output.get("completion") or []:
            role = message.get("role") if isinstance(message, dict) else message.role
            turns += role == "assistant"
            calls += role == "tool"
        usage = output.get("token_usage") or {}
        tokens += int(usage.get("output_tokens", usage.get("completion_tokens", 0)) or 0)
        errors += bool(output.get("error"))
    first_error = next((str(o["error"]) for o in outputs if o.get("error")), "")
    return {
        "trajectories": len(outputs),
        "completed": sum(1 for o in outputs if o.get("is_completed") and not o.get("error")),
        "turns": turns,
        "tool_calls": calls,
        "generated_tokens": tokens,
        "failed": errors,
        "note": f"verifiers {getattr(vf, '__version__', '?')} ToolEnv, /v1/chat/completions"
        + (f"; first error: {first_error[:300]}" if first_error else ""),
        **measured,
    }


def _openai_metadata() -> Any:
    """An httpx transport between verifiers and SGLang 0.5.23 that changes two things.

    * Answers: SGLang puts the weight-version spans (a list) in ``metadata``, which the
      OpenAI SDK types as strings only; verifiers validates the answer and failed every
      rollout on it. That one key is dropped (the version string stays).
    * Requests: verifiers marks every tool ``strict``, and SGLang then constrains the
      call's decoding with a grammar; the demo model ran to ``max_tokens`` with empty
      content on every first turn. ``strict`` is dropped, so the server samples as it
      does for toolrollout and lock-step (no constrained decoding)."""
    import httpx

    class OpenAIMetadata(httpx.AsyncBaseTransport):
        def __init__(self) -> None:
            self._inner = httpx.AsyncHTTPTransport()

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            sent = json.loads(request.content) if request.content.startswith(b"{") else None
            if isinstance(sent, dict) and sent.get("tools"):
                for tool in sent["tools"]:
                    tool.get("function", {}).pop("strict", None)
                headers = [
                    (k, v) for k, v in request.headers.items() if k.lower() != "content-length"
                ]
                request = httpx.Request(
                    request.method, request.url, headers=headers, content=json.dumps(sent).encode()
                )
            response = await self._inner.handle_async_request(request)
            body = await response.aread()
            data = json.loads(body) if body.startswith(b"{") else None
            if isinstance(data, dict) and isinstance(data.get("metadata"), dict):
                data["metadata"].pop("weight_versions", None)
                body = json.dumps(data).encode()
            headers = [(k, v) for k, v in response.headers.items() if k.lower() != "content-length"]
            return httpx.Response(response.status_code, headers=headers, content=body)

        async def aclose(self) -> None:
            await self._inner.aclose()

    return OpenAIMetadata()


WORKERS = {
    "toolrollout": _worker_toolrollout,
    "lockstep": _worker_lockstep,
    "verifiers": _worker_verifiers,
    "engine-only": _worker_engine_only,
}


def worker_main(mode: str, cfg: dict[str, Any], url: str, record: Path) -> None:
    import anyio

    recorded: Turns = json.loads(record.read_text()) if mode == "engine-only" else []

    async def run() -> dict[str, Any]:
        return await WORKERS[mode](cfg, url, recorded)

    result = anyio.run(run)
    if "recorded_turns" in result:
        record.write_text(json.dumps(result.pop("recorded_turns")))
    sys.stdout.write(json.dumps(result) + "\n")


# ---------------------------------------------------------------- the harness


def _group_pids(pgid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid:
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def _server_pgid(url: str) -> int:
    """The process group of the ``sglang serve`` on ``url``'s port (the launcher gives
    each server a session of its own: scheduler and detokenizer included)."""
    port = url.rsplit(":", 1)[1].encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in argv and b"--port" in argv and argv[argv.index(b"--port") + 1] == port:
            return os.getpgid(int(entry.name))
    raise SystemExit(f"no sglang serve process on {url}")


def _pin(pids: list[int], core: int) -> None:
    """Every thread of ``pids`` on ``core`` (threads started later inherit it)."""
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                os.sched_setaffinity(int(task.name), {core})
            except OSError:
                continue


def _cpu_s(pids: list[int]) -> float:
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def _run_mode(
    mode: str, cfg: dict[str, Any], url: str, record: Path, python: str, core: int
) -> dict[str, Any]:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": str(REPO / "src"),
    }
    command = [python, __file__, "--worker", mode, "--url", url, "--record", str(record)]
    command += ["--config", json.dumps(cfg)]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=1800,
        preexec_fn=lambda: os.sched_setaffinity(0, {core}),
    )
    if done.returncode != 0:
        raise SystemExit(f"mode {mode} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _ratios(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    ours = results.get("toolrollout", {}).get("makespan_s")
    out: dict[str, float] = {}
    if not ours:
        return out
    for mode, name in (("lockstep", "lockstep_over_toolrollout"),
                       ("verifiers", "verifiers_over_toolrollout"),
                       ("engine-only", "engine_only_over_toolrollout")):  # fmt: skip
        if mode in results:
            out[name] = results[mode]["makespan_s"] / ours
    return out


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = report["results"]
    modes = [m for m in MODES if m in results]
    walls = [results[m]["makespan_s"] for m in modes]
    clients = [results[m]["client_cpu_s"] for m in modes]
    servers = [results[m]["server_cpu_s"] for m in modes]
    fig, ax = plt.subplots(figsize=(8, 4.2))
    x = range(len(modes))
    ax.bar([i - 0.27 for i in x], walls, 0.27, label="makespan (wall s)", color="#4c72b0")
    ax.bar(x, servers, 0.27, label="server CPU s (its core)", color="#dd8452")
    ax.bar([i + 0.27 for i in x], clients, 0.27, label="client CPU s (its core)", color="#55a868")
    bound = results.get("engine-only", {}).get("makespan_s")
    if bound:
        ax.axhline(bound, color="grey", linestyle="--", linewidth=1, label="engine-only bound")
    ours = results["toolrollout"]["makespan_s"]
    labels = [f"{m}\n{results[m]['makespan_s'] / ours:.2f}x toolrollout" for m in modes]
    ax.set_xticks(list(x), labels)
    ax.set_ylabel("seconds")
    load = report["machine"]
    ax.set_title(
        f"Real SGLang {report['server']['sglang']} on CPU, demo model, "
        f"{report['config']['prompts']} prompts\nload average before/after "
        f"{load['loadavg_before'][0]:.1f} / {load['loadavg_after'][0]:.1f} "
        f"on {load['cpus']} cores (other work shared the machine)",
        fontsize=9,
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--tool-median", type=float, default=1.0, help="seconds")
    parser.add_argument("--tool-sigma", type=float, default=1.0)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--server-core", type=int, default=0)
    parser.add_argument("--client-core", type=int, default=1)
    parser.add_argument(
        "--verifiers-python", default=str(REPO / ".engines" / "verifiers" / "bin" / "python")
    )
    parser.add_argument("--out", type=Path, default=Path("bench_real_sglang.json"))
    parser.add_argument("--plot", type=Path, default=Path("bench_real_sglang.png"))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--record", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker_main(args.worker, json.loads(args.config), args.url, args.record)
        return

    import tempfile

    import httpx

    sys.path.insert(0, str(REPO))  # the test suite's launcher of real SGLang servers
    from tests.real_engines.sglang._launch import sglang_server

    cfg = {
        "prompts": args.prompts,
        "max_turns": args.max_turns,
        "max_new_tokens": args.max_new_tokens,
        "concurrency": args.concurrency,
        "tool_median": args.tool_median,
        "tool_sigma": args.tool_sigma,
    }
    modes = [m for m in args.modes.split(",") if m]
    notes: dict[str, str] = {}
    if "verifiers" in modes and not Path(args.verifiers_python).exists():
        modes.remove("verifiers")
        notes["verifiers"] = f"left out: {args.verifiers_python} missing"
    results: dict[str, dict[str, Any]] = {}
    machine: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "loadavg_before": list(os.getloadavg()),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    with tempfile.TemporaryDirectory() as tmp:
        record = Path(tmp) / "turns.json"
        server_args = ("--tool-call-parser", "qwen25")
        with sglang_server(Path(tmp), dtype="float32", extra_args=server_args) as server:
            pids = _group_pids(_server_pgid(server.url))
            _pin(pids, args.server_core)
            version = httpx.get(f"{server.url}/server_info", timeout=30).json().get("version")
            for mode in modes:
                httpx.post(f"{server.url}/flush_cache", timeout=30).raise_for_status()
                python = args.verifiers_python if mode == "verifiers" else sys.executable
                before, load = _cpu_s(pids), os.getloadavg()[0]
                print(f"running {mode}", file=sys.stderr, flush=True)
                result = _run_mode(mode, cfg, server.url, record, python, args.client_core)
                result["server_cpu_s"] = _cpu_s(pids) - before
                result["loadavg_1m_before_after"] = [load, os.getloadavg()[0]]
                results[mode] = result
                print(f"  {json.dumps(result)}", file=sys.stderr, flush=True)
    machine["loadavg_after"] = list(os.getloadavg())
    report = {
        "config": cfg,
        "server": {"sglang": version, "dtype": "float32", "args": list(server_args)},
        "pinning": {"server_core": args.server_core, "client_core": args.client_core},
        "results": results,
        "ratios": _ratios(results),
        "notes": notes,
        "machine": machine,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    plot(report, args.plot)
    print(json.dumps(report["ratios"], indent=2))


if __name__ == "__main__":
    main()
