"""Gateway overhead per request: a chat request through ``toolrollout gateway`` against
the same generation as a bare ``POST /generate`` to the engine.

Starts ``toolrollout serve`` (the demo model) and ``toolrollout gateway --engine-url`` in
front of it, then runs ``--sessions`` conversations of ``--turns`` user turns each. Every
gateway request is followed by its bare twin: the same conversation rendered by the client
itself (the token ids the gateway sends, for the demo template), ``ignore_eos`` and as many
new tokens as the gateway's answer had, so the engine does the same work both times. The
difference of the two latencies is what the gateway costs: the HTTP hop, session matching,
the template delta, tool-call parsing and the recording. Medians and p90 go to the terminal
and ``benchmarks/results/gateway.json``.

    python benchmarks/bench_gateway.py [--sessions 8] [--turns 6] [--max-tokens 16]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from toolrollout._net import free_port
from toolrollout.apps.demo import DEMO_MODEL_PATH
from toolrollout.chat import ChatFormat
from toolrollout.spec._policy import load_tokenizer

RESULTS = Path(__file__).resolve().parent / "results" / "gateway.json"
QUESTIONS = ["What is 12 * 7?", "And plus 3?", "Divide that by 3.", "Is it prime?"]


@contextmanager
def _process(args: list[str], health: str) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{args[:4]} exited: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
            try:
                if httpx.get(health, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(health)
            time.sleep(0.3)
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=60)


def _stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "median_ms": round(statistics.median(ordered) * 1000, 3),
        "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))] * 1000, 3),
        "mean_ms": round(statistics.fmean(ordered) * 1000, 3),
    }


def core_cost(
    tokenizer: Any, sessions: int, turns: int, *, stream: bool = False
) -> dict[str, float]:
    """``Gateway.complete`` in process on a zero-latency scripted engine: the gateway's own
    work per request (matching, delta, parsing, bookkeeping) without HTTP or a model. With
    ``stream``, ``Gateway.stream`` read to its end, the engine sending one id per chunk
    (adds the incremental decode and the hold-back of each chunk)."""
    import asyncio

    from toolrollout.apps.gateway import ChatRequest, ChatResult, Gateway
    from toolrollout.testing import ScriptedEngine

    answer = tokenizer.encode("The answer is 87, as computed.<|im_end|>", add_special_tokens=False)
    engine = ScriptedEngine(lambda request: answer)
    seconds: list[float] = []

    async def conversations() -> None:
        async with Gateway(engine, tokenizer) as gateway:
            for session in range(sessions):
                messages: list[dict[str, Any]] = [
                    {"role": "system", "content": "You are a careful calculator assistant."}
                ]
                for turn in range(turns):
                    messages.append({"role": "user", "content": QUESTIONS[turn % len(QUESTIONS)]})
                    request = ChatRequest(session=f"core-{session}", messages=tuple(messages))
                    started = time.perf_counter()
                    if stream:
                        async for item in gateway.stream(request):
                            result = item
                        assert isinstance(result, ChatResult)
                    else:
                        result = await gateway.complete(request)
                    seconds.append(time.perf_counter() - started)
                    messages.append({"role": "assistant", "content": result.choices[0].content})

    asyncio.run(conversations())
    return _stats(seconds)


def run(args: argparse.Namespace) -> dict[str, Any]:
    tokenizer = load_tokenizer(DEMO_MODEL_PATH)
    chat = ChatFormat(tokenizer)
    engine_port, gateway_port = free_port(), free_port()
    engine_url = f"http://127.0.0.1:{engine_port}"
    gateway_url = f"http://127.0.0.1:{gateway_port}"
    toolrollout = [sys.executable, "-m", "toolrollout"]
    admin = secrets.token_urlsafe(16)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "sessions.parquet"
        serve = [*toolrollout, "serve", "--port", str(engine_port), "--threads", "1"]
        gateway = [
            *toolrollout,
            "gateway",
            "--engine-url",
            engine_url,
            "--port",
            str(gateway_port),
            "--out",
            str(out),
            "--admin-api-key",  # the listing of every session is the trainer's
            admin,
        ]
        with (
            _process(serve, f"{engine_url}/health"),
            _process(gateway, f"{gateway_url}/health"),
            httpx.Client(timeout=120) as http,
        ):
            through, bare = [], []
            for session in range(args.sessions):
                messages: list[dict[str, Any]] = [
                    {"role": "system", "content": "You are a careful calculator assistant."}
                ]
                for turn in range(args.turns):
                    messages.append({"role": "user", "content": QUESTIONS[turn % len(QUESTIONS)]})
                    body = {
                        "messages": messages,
                        "max_tokens": args.max_tokens,
                        "temperature": 0.0,
                    }
                    started = time.perf_counter()
                    reply = http.post(
                        f"{gateway_url}/v1/chat/completions",
                        json=body,
                        headers={"x-toolrollout-session": f"bench-{session}"},
                    )
                    through.append(time.perf_counter() - started)
                    reply.raise_for_status()
                    data = reply.json()
                    new_tokens = data["usage"]["completion_tokens"]
                    ids = chat.render_prompt(messages)
                    started = time.perf_counter()
                    direct = http.post(
                        f"{engine_url}/generate",
                        json={
                            "input_ids": ids,
                            "sampling_params": {
                                "max_new_tokens": new_tokens,
                                "temperature": 0.0,
                                "ignore_eos": True,
                            },
                            "return_logprob": True,
                        },
                    )
                    bare.append(time.perf_counter() - started)
                    direct.raise_for_status()
                    message = data["choices"][0]["message"]
                    messages.append({"role": "assistant", "content": message["content"] or ""})
            listing = http.get(
                f"{gateway_url}/v1/sessions", headers={"authorization": f"Bearer {admin}"}
            )
            sessions = listing.json()["sessions"]
    overhead = [g - b for g, b in zip(through, bare, strict=True)]
    return {
        "benchmark": "gateway overhead per request",
        "requests": len(through),
        "sessions": args.sessions,
        "turns": args.turns,
        "max_tokens": args.max_tokens,
        "segments_per_session": sorted({s["segments"] for s in sessions.values()}),
        "through_gateway": _stats(through),
        "bare_generate": _stats(bare),
        "overhead": _stats(overhead),
        "core_in_process": core_cost(tokenizer, args.sessions, args.turns),
        "core_in_process_streamed": core_cost(tokenizer, args.sessions, args.turns, stream=True),
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    result = run(args)
    table = Table(title=f"gateway overhead, {result['requests']} requests")
    for column in ("", "median ms", "p90 ms", "mean ms"):
        table.add_column(column, justify="right" if column else "left")
    names = (
        "through_gateway",
        "bare_generate",
        "overhead",
        "core_in_process",
        "core_in_process_streamed",
    )
    for name in names:
        s = result[name]
        table.add_row(name, str(s["median_ms"]), str(s["p90_ms"]), str(s["mean_ms"]))
    Console().print(table)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
