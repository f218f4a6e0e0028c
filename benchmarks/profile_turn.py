"""Where a rollout turn's CPU goes: shares of a py-spy profile of a benchmark worker.

    python benchmarks/bench_client_cpu.py --rounds 1 --modes toolrollout --profile /tmp/prof
    python benchmarks/profile_turn.py /tmp/prof/toolrollout-0.txt

Reads a ``py-spy record --format raw`` file (one ``frame;frame;... count`` line per
stack), keeps the samples of the measured run (inside the event loop, after the imports
and the tokenizer load) and puts each sample in the first category of :data:`CATEGORIES`
one of whose frames it holds. Garbage collection runs inside whatever allocated, so its
cost is spread over the categories (``bench_client_cpu.py`` does not separate it).
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("prompt render and tokenization", ("render_prompt (",)),
    ("drift check at the end (render + tokenize)", ("DriftLedger.final_check",)),
    ("tool delta: template renders", ("ChatFormat.tool_turn_delta_text",)),
    ("tool delta: tokenization", ("ChatFormat.tool_turn_delta",)),
    ("tool call: the tool's own work (its HTTP request)", ("FunctionTool.call",)),
    ("tool call: executor (limits, timeout, retries)", ("ToolExecutor.",)),
    ("tool turn: messages, result cut", ("tool_step", "_run_tools")),
    ("engine: request body to JSON", ("encode_json",)),
    ("engine: response JSON decode", ("parse_json",)),
    ("engine: logprob parsing, result", ("parse_result",)),
    ("engine: HTTP send and receive", ("SGLangClient.",)),
    ("model turn: decode", ("ChatFormat.model_text",)),
    ("model turn: tool-call parsing", ("ToolCallParser.parse",)),
    ("model turn: spans, message, bookkeeping", ("append_model_turn",)),
    ("env turn: bookkeeping", ("append_env_turn",)),
    ("request ids, limiter, seeds", ("_generate (",)),
    ("freeze and metrics", ("TrajectoryState.freeze",)),
    ("runner, scheduling", ("RolloutRunner.",)),
    ("bare POST driver", ("_run_httpx",)),
)
OTHER = "event loop and HTTP callbacks (both engine and tool requests)"


def shares(path: Path) -> tuple[int, Counter[str]]:
    """Samples of the measured run and their count per category."""
    counts: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, number = line.rpartition(" ")
        if "run_forever" not in stack or "from_pretrained" in stack or "_find_and_load" in stack:
            continue
        n = int(number)
        total += n
        frames = stack.split(";")
        for name, keys in CATEGORIES:
            if any(key in frame for frame in frames for key in keys):
                counts[name] += n
                break
        else:
            counts[OTHER] += n
    return total, counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profiles", type=Path, nargs="+", help="py-spy raw files, side by side")
    args = parser.parse_args()
    results = [shares(path) for path in args.profiles]
    names = [name for name, _ in CATEGORIES] + [OTHER]
    header = " | ".join(path.stem for path in args.profiles)
    print(f"| where | {header} |")
    print("|---|" + "---|" * len(results))
    for name in names:
        cells = [f"{100 * counts[name] / max(total, 1):.1f}%" for total, counts in results]
        if any(cell != "0.0%" for cell in cells):
            print(f"| {name} | " + " | ".join(cells) + " |")
    print("| samples | " + " | ".join(str(total) for total, _ in results) + " |")


if __name__ == "__main__":
    main()
