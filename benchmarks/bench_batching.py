"""How much continuous batching buys: 1 request vs 16 concurrent vs 16 sequential.

Runs the embedded engine on the bundled demo model (or, when it has not been trained yet,
a random model of the same size) and times, in one process and one run:

* one request of ``--max-new-tokens`` tokens (``ignore_eos`` so every request is as long),
* ``--concurrency`` identical requests submitted together (decoded as one batch),
* the same number of requests one after another (the no-batching baseline).

The scenarios are interleaved ``--repeats`` times and the median wall times reported. The
table goes to the terminal and the numbers to ``benchmarks/results/batching.json``.

    python benchmarks/bench_batching.py [--model PATH] [--max-new-tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from toolrollout.engines._types import GenerateRequest, SamplingParams
from toolrollout.engines.embedded import EmbeddedEngine

RESULTS = Path(__file__).resolve().parent / "results" / "batching.json"
PROMPT = "<|im_start|>user\nWhat is 12 * 7 + 3?<|im_end|>\n<|im_start|>assistant\n"
DEMO_SIZE = {"vocab": 512, "hidden": 128, "layers": 2, "heads": 2, "kv_heads": 1, "context": 1024}
"""The shape of the demo model (see toolrollout/apps/demo/train.py)."""


def random_demo_sized_model(path: Path) -> Path:
    """A random Qwen2 model with the demo's shape and a byte-level BPE tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=DEMO_SIZE["vocab"],
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(
        [PROMPT, "calculator 12 * 7 + 3 = 87", "The answer is 87."] * 50, trainer
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tokenizer.save_pretrained(path)
    torch.manual_seed(0)
    Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=len(tokenizer),
            hidden_size=DEMO_SIZE["hidden"],
            intermediate_size=DEMO_SIZE["hidden"] * 4,
            num_hidden_layers=DEMO_SIZE["layers"],
            num_attention_heads=DEMO_SIZE["heads"],
            num_key_value_heads=DEMO_SIZE["kv_heads"],
            max_position_embeddings=DEMO_SIZE["context"],
            eos_token_id=tokenizer.eos_token_id,
        )
    ).save_pretrained(path)
    return path


async def wall_time(make: Callable[[], Awaitable[Any]]) -> float:
    t0 = time.perf_counter()
    await make()
    return time.perf_counter() - t0


async def run(args: argparse.Namespace, model_path: Path, model_kind: str) -> dict[str, Any]:
    n, tokens = args.concurrency, args.max_new_tokens
    async with EmbeddedEngine(
        model_path, max_batch_size=max(n, 1), device=args.device, num_threads=args.threads
    ) as engine:
        prompt = tuple(engine.tokenize(PROMPT))

        def one() -> Awaitable[Any]:
            sampling = SamplingParams(max_new_tokens=tokens, ignore_eos=True, seed=0)
            return engine.generate(GenerateRequest(input_ids=prompt, sampling=sampling))

        async def concurrent() -> None:
            await asyncio.gather(*(one() for _ in range(n)))

        async def sequential() -> None:
            for _ in range(n):
                await one()

        await concurrent()  # warm-up: allocator, kernels, tokenizer caches
        # Interleave the scenarios so that a change in machine load hits all of them alike.
        single_all, together_all, one_by_one_all = [], [], []
        for _ in range(args.repeats):
            single_all.append(await wall_time(one))
            together_all.append(await wall_time(concurrent))
            one_by_one_all.append(await wall_time(sequential))
        single = statistics.median(single_all)
        together = statistics.median(together_all)
        one_by_one = statistics.median(one_by_one_all)
        device, dtype = engine.device, engine.dtype
    return {
        "model": str(model_path),
        "model_kind": model_kind,
        "device": device,
        "dtype": dtype,
        "torch": torch.__version__,
        "torch_threads": args.threads or torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "prompt_tokens": len(prompt),
        "max_new_tokens": tokens,
        "concurrency": n,
        "repeats": args.repeats,
        "seconds": {
            "single": single,
            f"concurrent_{n}": together,
            f"sequential_{n}": one_by_one,
        },
        "all_seconds": {
            "single": single_all,
            f"concurrent_{n}": together_all,
            f"sequential_{n}": one_by_one_all,
        },
        "ratio_concurrent_over_single": together / single,
        "speedup_concurrent_vs_sequential": one_by_one / together,
        "tokens_per_second": {
            "single": tokens / single,
            f"concurrent_{n}": n * tokens / together,
            f"sequential_{n}": n * tokens / one_by_one,
        },
    }


def report(result: dict[str, Any], console: Console) -> None:
    n = result["concurrency"]
    table = Table(
        title=(
            f"Embedded engine batching — {result['model_kind']} model, {result['device']} "
            f"({result['torch_threads']} threads), "
            f"{result['max_new_tokens']} new tokens/request, median of {result['repeats']}"
        )
    )
    table.add_column("scenario")
    table.add_column("wall time (s)", justify="right")
    table.add_column("× single", justify="right")
    table.add_column("generated tok/s", justify="right")
    single = result["seconds"]["single"]
    for key, label in (
        ("single", "1 request"),
        (f"concurrent_{n}", f"{n} concurrent requests"),
        (f"sequential_{n}", f"{n} sequential requests"),
    ):
        seconds = result["seconds"][key]
        table.add_row(
            label,
            f"{seconds:.3f}",
            f"{seconds / single:.2f}",
            f"{result['tokens_per_second'][key]:.0f}",
        )
    console.print(table)
    console.print(
        f"{n} concurrent take {result['ratio_concurrent_over_single']:.2f}× the time of one "
        f"request (no batching would be ~{n}×); "
        f"{result['speedup_concurrent_vs_sequential']:.1f}× faster than {n} sequential."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="default: the demo model")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default=None)
    parser.add_argument(
        "--threads", type=int, default=1, help="engine torch threads (tiny models: 1 is fastest)"
    )
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    console = Console()

    with tempfile.TemporaryDirectory() as tmp:
        model_path, kind = args.model, "given"
        if model_path is None:
            from toolrollout.apps.demo import DEMO_MODEL_PATH

            if (DEMO_MODEL_PATH / "config.json").is_file():
                model_path, kind = DEMO_MODEL_PATH, "demo"
            else:
                console.print("[yellow]demo model not trained yet: using a random one of its size")
                model_path, kind = random_demo_sized_model(Path(tmp)), "random demo-sized"
        result = asyncio.run(run(args, model_path, kind))

    report(result, console)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"written to {args.output}")


if __name__ == "__main__":
    main()
