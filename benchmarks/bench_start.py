"""How fast a run gets its first requests out: the start of many distinct prompts.

Every trajectory renders its prompt (chat template, then the tokenizer) before its first
request. This measures, in one process and one run, the time from ``runner.run`` to the
moment the last of the trajectories' first requests reaches the engine, beside two floors
that render the same prompts and send nothing:

* ``runner``: ``RolloutRunner.run`` over a ``ScriptedEngine`` whose script records each
  request's arrival and never answers (the engine seam, no HTTP);
* ``render, tokenizer.encode``: the template and ``tokenizer.encode`` per prompt (how the
  runner tokenized before prompts were rendered in batches);
* ``render, encode_many``: the template per prompt and ``ChatFormat.encode_many`` per 64
  (what the runner does now, alone).

The prompts are the rollout benchmark's (``Workload``: distinct scripts, a shared problem
text per group), rendered with the demo tokenizer and the benchmark's tool. Run with
``TOKENIZERS_PARALLELISM=false`` to keep the tokenizer on one thread, as the rollout
benchmark's worker does.

    python benchmarks/bench_start.py --trajectories 1024 --shared-prompt-words 400
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import anyio
from transformers import AutoTokenizer

from toolrollout.apps.bench import Workload
from toolrollout.apps.bench._tools import LookupClient
from toolrollout.apps.demo import DEMO_MODEL_PATH
from toolrollout.chat import ChatFormat
from toolrollout.engines import GenerateRequest, SamplingParams
from toolrollout.rollout import RolloutConfig
from toolrollout.rollout._batch import START_BATCH
from toolrollout.spec import RunSpec, build_runner
from toolrollout.testing import ScriptedEngine, ScriptedOutput


async def _runner_start(rows: list[dict[str, Any]], tokenizer: Any, tool: Any) -> dict[str, float]:
    arrivals: list[float] = []
    all_arrived = anyio.Event()

    async def never_answer(request: GenerateRequest) -> ScriptedOutput:
        """Record the request's arrival; the run is cancelled before any answer."""
        arrivals.append(time.perf_counter())
        if len(arrivals) == len(rows):
            all_arrived.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    config = RolloutConfig(
        sampling=SamplingParams(max_new_tokens=300), max_turns=6, concurrency=len(rows)
    )
    runner = build_runner(RunSpec(tools=(tool,), config=config, rewards=(), vision="off"),
                          ScriptedEngine(never_answer), tokenizer=tokenizer)  # fmt: skip
    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        tg.start_soon(runner.run, rows)
        await all_arrived.wait()
        tg.cancel_scope.cancel()
    return {
        "first_request_s": arrivals[0] - started,
        "last_first_request_s": arrivals[-1] - started,
    }


def _render_floor(rows: list[dict[str, Any]], chat: ChatFormat, *, batched: bool) -> float:
    started = time.perf_counter()
    if batched:
        for first in range(0, len(rows), START_BATCH):
            texts = [
                chat.render_text(row["messages"], add_generation_prompt=True)
                for row in rows[first : first + START_BATCH]
            ]
            chat.encode_many(texts)
    else:
        tokenizer = chat.tokenizer
        for row in rows:
            text = chat.render_text(row["messages"], add_generation_prompt=True)
            tokenizer.encode(text, add_special_tokens=False)
    return time.perf_counter() - started


def measure_start(
    trajectories: int = 1024,
    n: int = 16,
    shared_prompt_words: int = 400,
    *,
    runner_only: bool = False,
) -> dict[str, Any]:
    """The figures of one run (see the module docstring); ``runner_only``: no floors."""
    workload = Workload(
        prompts=max(1, trajectories // n), n=n, shared_prompt_words=shared_prompt_words
    )
    rows = workload.rows()
    tokenizer = AutoTokenizer.from_pretrained(str(DEMO_MODEL_PATH))
    tool = LookupClient("http://127.0.0.1:9").tool()  # never called: no answer comes back
    chat = ChatFormat(tokenizer, tools=[tool.schema()])
    chat.render_prompt(rows[0]["messages"])  # warm the template and the tokenizer
    start = anyio.run(_runner_start, rows, tokenizer, tool)
    result: dict[str, Any] = {
        "trajectories": len(rows),
        **{k: round(v, 4) for k, v in start.items()},
    }
    if runner_only:
        return result
    floor_hf = _render_floor(rows, chat, batched=False)
    floor_batched = _render_floor(rows, chat, batched=True)
    sample = rows[:32]
    tokens = sum(len(chat.render_prompt(row["messages"])) for row in sample) / len(sample)
    return {
        **result,
        "prompt_tokens_mean": round(tokens, 1),
        "render_tokenizer_encode_s": round(floor_hf, 4),
        "render_encode_many_s": round(floor_batched, 4),
        "runner_over_its_render_floor": round(start["last_first_request_s"] / floor_batched, 3),
        "encode_many_over_tokenizer_encode": round(floor_batched / floor_hf, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--trajectories", type=int, default=1024)
    parser.add_argument("--n", type=int, default=16)
    parser.add_argument("--shared-prompt-words", type=int, default=400)
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--runner-only",
        action="store_true",
        help="measure the runner alone (to run an older checkout's toolrollout with "
        "PYTHONPATH=<its src>, which has no encode_many)",
    )
    args = parser.parse_args()
    result = measure_start(
        args.trajectories, args.n, args.shared_prompt_words, runner_only=args.runner_only
    )
    for key, value in result.items():
        print(f"{key:36} {value}")
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
