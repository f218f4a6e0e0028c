"""Soak: many trajectories at high concurrency, checking for leaks rather than speed.

The engine is an in-process scripted engine (a tool call, then an answer), so the loop,
the chat template, the real calculator tool and the crash-safe shard writer are what is
exercised. The run goes in waves; after each wave the resident memory, open file
descriptors and child processes are sampled. A leak shows as growth after the warm-up
waves; every (prompt, sample) must have exactly one row on disk at the end.

    python benchmarks/bench_soak.py            # 10,000 trajectories; writes results/soak.json
"""

from __future__ import annotations

import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from toolrollout.apps.demo import DEMO_MODEL_PATH
from toolrollout.engines import GenerateRequest, SamplingParams
from toolrollout.rollout import (
    RolloutConfig,
    RolloutRunner,
    ShardWriter,
    Trajectory,
    read_shards,
)
from toolrollout.testing import ScriptedEngine, ScriptedOutput
from toolrollout.tools import calculator_tool

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6 * 7"}}\n</tool_call>'


def rss_mib() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def child_processes() -> int:
    return sum(
        len((task / "children").read_text().split()) for task in Path("/proc/self/task").iterdir()
    )


def live_objects() -> tuple[int, int]:
    """Objects the garbage collector tracks, and how many of them are this soak's trajectories.

    Only trajectories whose group id starts with ``soak-`` count: in a test process, earlier
    tests may hold trajectories of their own, which are not the soak's to release (a
    pytest-xdist worker counted 8 after the last wave once; not reproduced alone)."""
    objects = gc.get_objects()
    mine = sum(1 for o in objects if type(o) is Trajectory and o.group_id.startswith("soak-"))
    return len(objects), mine


def fast_engine(tokenizer: Any) -> ScriptedEngine:
    """Turn 0 calls the calculator, turn 1 answers; outputs are tokenized once."""
    call = tokenizer.encode(CALL + "<|im_end|>", add_special_tokens=False)
    answer = tokenizer.encode("It is 42.<|im_end|>", add_special_tokens=False)
    outputs = {
        "t0": ScriptedOutput(call, logprobs=[-0.25] * len(call)),
        "t1": ScriptedOutput(answer, logprobs=[-0.5] * len(answer)),
    }

    def respond(request: GenerateRequest) -> ScriptedOutput:
        assert request.rid is not None
        return outputs[request.rid.rsplit("-", 2)[1]]

    return ScriptedEngine(respond)


def soak(
    total: int = 10_000, waves: int = 10, concurrency: int = 512, out: Path | None = None
) -> dict[str, Any]:
    """Run ``total`` trajectories in ``waves``; returns the samples and the row check.

    Each wave is one ``runner.run`` of ``total // waves`` prompts with distinct group ids,
    so a row's uid is unique over the whole soak."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(DEMO_MODEL_PATH))
    per_wave = total // waves
    config = RolloutConfig(
        sampling=SamplingParams(max_new_tokens=64),
        n=1,
        max_turns=3,
        concurrency=concurrency,
        drift_check=False,
    )
    prompts = [
        {"messages": [{"role": "user", "content": f"What is 6 * 7? (#{i})"}], "answer": "42"}
        for i in range(total)
    ]
    engine = fast_engine(tokenizer)
    runner = RolloutRunner(engine, tokenizer, [calculator_tool()], config=config)
    samples: list[dict[str, float]] = []
    statuses: dict[str, int] = {}
    tmp = tempfile.TemporaryDirectory() if out is None else None
    parts = Path(tmp.name if tmp else str(out)) / "soak.parts"

    async def main() -> None:
        with ShardWriter(parts, rows_per_shard=500) as writer:
            for wave in range(waves):
                chunk = prompts[wave * per_wave : (wave + 1) * per_wave]
                group_ids = [f"soak-p{wave * per_wave + i}" for i in range(len(chunk))]
                started = time.perf_counter()

                def on_result(trajectory: Any) -> None:
                    writer.write(trajectory)
                    key = str(trajectory.status)
                    statuses[key] = statuses.get(key, 0) + 1

                await runner.run(chunk, on_result=on_result, group_ids=group_ids)
                del on_result
                engine.requests.clear()  # the test double records requests; not a leak
                gc.collect()
                objects, trajectories = live_objects()
                samples.append(
                    {
                        "wave": wave,
                        "seconds": time.perf_counter() - started,
                        "rss_mib": rss_mib(),
                        "open_fds": open_fds(),
                        "children": child_processes(),
                        "live_objects": objects,
                        "live_trajectories": trajectories,
                    }
                )

    anyio.run(main)
    uids = read_shards(parts).column("uid").to_pylist()
    if tmp is not None:
        tmp.cleanup()
    warm = samples[min(2, len(samples) - 1)]
    last = samples[-1]
    return {
        "trajectories": total,
        "concurrency": concurrency,
        "statuses": statuses,
        "rows_on_disk": len(uids),
        "distinct_rows": len(set(uids)),
        "missing_rows": per_wave * waves - len(set(uids)),
        "trajectories_per_second": per_wave * waves / sum(s["seconds"] for s in samples),
        "rss_growth_after_warmup_mib": last["rss_mib"] - warm["rss_mib"],
        "object_growth_after_warmup": last["live_objects"] - warm["live_objects"],
        "live_trajectories_at_end": last["live_trajectories"],
        "fd_growth_after_warmup": last["open_fds"] - warm["open_fds"],
        "child_growth_after_warmup": last["children"] - warm["children"],
        "waves": samples,
    }


if __name__ == "__main__":
    report = soak(int(sys.argv[1]) if len(sys.argv) > 1 else 10_000)
    results = Path(__file__).parent / "results"
    results.mkdir(exist_ok=True)
    (results / "soak.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "waves"}, indent=2))
