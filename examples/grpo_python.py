"""On-policy GRPO (TRL) that teaches the demo model its python-sandbox task, measured.

    python examples/grpo_python.py                      # the published run (docs/trainers.md)
    python examples/grpo_python.py --steps 2 --eval-prompts 8 --out-dir /tmp/smoke

One command, four stages, all CPU:

1. **Data.** Training prompts are drawn from the python task generator's *train* split
   (``toolrollout.apps.demo.code_tasks``: a program belongs to a split by a stable hash of its
   code), held-out prompts from its *held-out* split, which the demo model never saw and
   GRPO never sees: the two sets share no program (checked). The held-out file starts with
   the 64 shipped prompts (``prompts_python.jsonl``) and continues with the same
   generator, so ``--eval-prompts`` only changes how many are scored.
2. **Before.** ``toolrollout eval`` (the real sandbox tool of ``tool_configs/sandbox.yaml``)
   scores the shipped demo model on the held-out prompts twice: ``--eval-samples``
   samples a problem at the training temperature (a problem scores its fraction correct:
   the policy GRPO optimizes; the headline) and greedy (a problem scores 0 or 1).
3. **GRPO.** TRL's ``GRPOTrainer`` with toolrollout's ``trl_rollout_func``: each step
   samples ``--group-size`` multi-turn trajectories per prompt from an in-process
   ``EmbeddedEngine``, runs every ``python`` call in the bubblewrap sandbox, and scores
   them with toolrollout's reward terms (``exact_match`` plus ``tool_error_penalty``). The
   adapter's ``weight_sync="auto"`` loads the trainer's weights into the engine after every
   optimizer step, so every batch is sampled by the policy being trained (each trajectory
   records the step as its ``weight_version``; the script checks it). The default recipe
   trains only the RMSNorm weights and clips advantages below at 0 (docs/trainers.md says
   which runs led there).
4. **After.** The same evaluations, same prompts, settings and seeds, on the trained
   model; each accuracy difference gets a paired bootstrap interval
   (``toolrollout.apps.eval.bootstrap_difference``, problems resampled).

Everything measured goes to ``<out-dir>/summary.json``; the reward curve to ``--plot``. The
last line printed is the result, in a fixed format a rerun can be checked against::

    held-out accuracy 0.454 -> 0.500, difference 95% CI [0.026, 0.067]

(run 10 of docs/trainers.md, these defaults with ``--threads 1``): the sampled evaluation
at the training temperature. The line before it is the same comparison for greedy decoding.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Before torch starts OpenMP: on a shared CPU, spinning OpenMP workers of 2 threads made
# each engine step 5-8x slower than 1 thread (measured here); passive waiting removes that.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

EXAMPLES = Path(__file__).resolve().parent
ROOT = EXAMPLES.parent
SANDBOX_CONFIG = ROOT / "tool_configs" / "sandbox.yaml"
SHIPPED_HELDOUT = 64
"""Size of the shipped held-out set (``prompts_python.jsonl``, seed 1234)."""
HELDOUT_SEED = 1234
"""Seed of the shipped held-out set; more held-out prompts continue its stream."""
TRAIN_SEED_OFFSET = 10_000
"""Training prompts use seed ``--seed + this``: a stream no demo training stage used."""
SUCCESS = 0.5
"""``toolrollout eval``'s default ``--success-threshold``: reward >= 0.5 is correct."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=40, help="optimizer steps")
    p.add_argument("--seed", type=int, default=0, help="training prompts, sampling, init")
    p.add_argument("--out-dir", type=Path, default=Path("grpo_python_out"))
    p.add_argument("--plot", type=Path, default=None, help="reward curve PNG (default: in out-dir)")
    p.add_argument("--train-prompts", type=int, default=1024, help="size of the training set")
    p.add_argument("--eval-prompts", type=int, default=256, help="held-out prompts scored")
    p.add_argument("--prompts-per-step", type=int, default=16)
    p.add_argument("--group-size", type=int, default=8, help="GRPO num_generations")
    p.add_argument("--learning-rate", type=float, default=1e-2)
    p.add_argument(
        "--positive-advantages", action=argparse.BooleanOptionalAction, default=True,
        help="clip advantages below at 0: only better-than-group samples are reinforced",
    )  # fmt: skip
    p.add_argument(
        "--trainable", default="norm",
        help="train only parameters whose name contains one of these comma-separated parts "
        "('' trains all; default: the RMSNorm weights, 640 of 361,600)",
    )  # fmt: skip
    p.add_argument("--lora-rank", type=int, default=0,
                   help="also train a low-rank adapter (peft LoRA) of this rank on every "
                   "linear layer; 0: none")  # fmt: skip
    p.add_argument("--optimizer", default="adamw_torch", help="transformers' optim name")
    p.add_argument("--beta", type=float, default=0.0, help="KL coefficient to the start")
    p.add_argument("--temperature", type=float, default=1.0, help="rollout sampling")
    p.add_argument("--tool-error-penalty", type=float, default=0.2,
                   help="reward subtracted per failed or malformed tool call")  # fmt: skip
    p.add_argument("--max-token-entropy", type=float, default=1.0,
                   help="train only model tokens where the policy's entropy is below this "
                   "many nats (0: all tokens)")  # fmt: skip
    p.add_argument("--max-turns", type=int, default=3, help="assistant turns per rollout")
    p.add_argument("--max-new-tokens", type=int, default=96, help="tokens per model turn")
    p.add_argument("--max-completion-length", type=int, default=384)
    p.add_argument("--threads", type=int, default=2, help="torch threads (trainer and engines)")
    p.add_argument("--eval-concurrency", type=int, default=32)
    p.add_argument("--eval-samples", type=int, default=4,
                   help="also N samples a problem at --temperature (<2: greedy only)")  # fmt: skip
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- data
def _row(prefix: str, index: int, task: Any) -> dict[str, Any]:
    from toolrollout.apps.demo.dialogs import DEFAULT_SYSTEM_PROMPT

    return {
        "id": f"{prefix}-{index:04d}",
        "messages": [
            {"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
            {"role": "user", "content": task.question},
        ],
        "answer": task.answer,
        "code": task.code,
    }


def build_splits(args: argparse.Namespace) -> tuple[list[dict[str, Any]], Path]:
    """Training rows (train split) and the held-out file (held-out split), disjoint."""
    from toolrollout.apps.demo import load_demo_prompts
    from toolrollout.apps.demo.code_tasks import generate_code_tasks

    n_eval = args.eval_prompts
    held = [
        _row("python", i, t)
        for i, t in enumerate(
            generate_code_tasks(max(n_eval, SHIPPED_HELDOUT), seed=HELDOUT_SEED, split="heldout")
        )
    ]
    shipped = load_demo_prompts("python")
    if [r["code"] for r in held[:SHIPPED_HELDOUT]] != [r["code"] for r in shipped]:
        raise RuntimeError("the task generator no longer reproduces prompts_python.jsonl")
    held = held[:n_eval]
    train = [
        _row("train", i, t)
        for i, t in enumerate(
            generate_code_tasks(
                args.train_prompts, seed=args.seed + TRAIN_SEED_OFFSET, split="train"
            )
        )
    ]
    overlap = {r["code"] for r in train} & {r["code"] for r in held}
    overlap |= {r["messages"][-1]["content"] for r in train} & {
        r["messages"][-1]["content"] for r in held
    }
    if overlap:
        raise RuntimeError(f"training and held-out prompts overlap: {sorted(overlap)[:3]}")
    path = args.out_dir / "heldout.jsonl"
    with path.open("w", encoding="utf-8") as f:
        for r in held:
            f.write(json.dumps(r) + "\n")
    with (args.out_dir / "train.jsonl").open("w", encoding="utf-8") as f:
        for r in train:
            f.write(json.dumps(r) + "\n")
    return train, path


def sandbox_config(out_dir: Path) -> Path:
    """``tool_configs/sandbox.yaml`` on a free port: a sandbox of this run's own, never one
    another program left on 8080 (it could stop mid-run)."""
    import yaml

    from toolrollout.sandbox._background import free_port

    data = yaml.safe_load(SANDBOX_CONFIG.read_text(encoding="utf-8"))
    entry = data["tools"][0]["config"]
    entry["sandbox_fusion_url"] = f"http://127.0.0.1:{free_port()}/run_code"
    path = out_dir / "sandbox.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- eval
def run_eval(
    args: argparse.Namespace, model: Path, dataset: Path, tools: Path, name: str, samples: int = 1
) -> dict[str, Any]:
    """``toolrollout eval`` on the held-out file; returns its metrics and per-problem scores.

    ``samples`` 1: greedy, a problem scores 0 or 1. More: that many samples per problem at
    the training temperature, a problem scores its fraction of correct samples (pass@1).
    """
    import polars as pl

    out = args.out_dir / name
    command = [
        sys.executable, "-m", "toolrollout", "eval",
        "--model", str(model), "--dataset", str(dataset), "--tool-config", str(tools),
        "--out-dir", str(out), "--threads", str(args.threads),
        "--concurrency", str(args.eval_concurrency), "--seed", str(args.seed),
        "--success-threshold", str(SUCCESS),
    ]  # fmt: skip
    if samples > 1:
        command += ["--n", str(samples), "--sampled", "--temperature", str(args.temperature)]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
        raise RuntimeError(f"toolrollout eval ({name}) exited with {done.returncode}")
    rows = pl.read_parquet(out / "trajectories.parquet")
    correct: dict[int, list[float]] = {}
    for r in rows.select("prompt_index", "reward").iter_rows(named=True):
        reward = r["reward"]
        correct.setdefault(int(r["prompt_index"]), []).append(
            float(reward is not None and reward >= SUCCESS)
        )
    if any(len(c) != samples for c in correct.values()):
        raise RuntimeError(f"toolrollout eval ({name}) did not return {samples} samples a problem")
    scores = {k: statistics.fmean(c) for k, c in correct.items()}
    metrics = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    tools_row = _tool_stats(rows)
    return {"scores": scores, "seconds": seconds, "metrics": metrics, "tools": tools_row}


def _tool_stats(rows: Any) -> dict[str, float]:
    calls = rows["num_tool_calls"].to_list()
    errors = rows["tool_errors"].to_list()
    parse = rows["parse_errors"].to_list()
    n = max(len(calls), 1)
    return {
        "calls_per_trajectory": sum(calls) / n,
        "tool_errors_per_trajectory": sum(errors) / n,
        "parse_errors_per_trajectory": sum(parse) / n,
        "trajectories_with_a_call": sum(1 for c in calls if c) / n,
        "failure_rate": sum(errors) / max(sum(calls), 1),
    }


# ----------------------------------------------------------------------------- train
def entropy_masked(base: type[Any], max_entropy: float) -> type[Any]:
    """``base`` (TRL's ``GRPOTrainer``) training only tokens where the policy is confident.

    A sampled trajectory that went wrong early goes on through positions where the tiny
    model's distribution is nearly flat (entropy above ~1 nat, about 10% of model tokens);
    the policy gradient there is mostly noise, and a negative advantage flattens those
    positions further. ``examples/grpo_gradient_check.py`` measures it: masking them raises
    the agreement between independent batches' gradients from ~0 to ~0.15 (docs/trainers.md).
    TRL's hook for a per-token mask is ``get_high_entropy_mask`` (its
    ``top_entropy_quantile`` keeps the *most* uncertain tokens); this keeps the others.
    """
    if max_entropy <= 0:
        return base

    class EntropyMaskedGRPOTrainer(base):  # type: ignore[misc,valid-type]
        def get_high_entropy_mask(self, entropies: Any, mask: Any, threshold: float) -> Any:
            kept = (entropies.detach() < max_entropy) & mask.bool()
            self._metrics["train"]["entropy_mask/kept"].append(
                float(kept.sum()) / max(float(mask.sum()), 1.0)
            )
            return kept

    return EntropyMaskedGRPOTrainer


def positive_advantages_only(base: type[Any]) -> type[Any]:
    """``base`` with each row's advantage clipped below at 0: only better-than-group rows move.

    Pushing down a failed sample's tokens spreads their probability over every other
    token, which flattens a small model's distribution where it was already unsure;
    raising the successful samples' tokens sharpens it. Rows worse than their group get
    advantage 0 (their tokens still count in the loss's normaliser).
    """

    class PositiveAdvantageGRPOTrainer(base):  # type: ignore[misc,valid-type]
        def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Any:
            return super()._compute_loss(
                model, {**inputs, "advantages": inputs["advantages"].clamp(min=0)}
            )

    return PositiveAdvantageGRPOTrainer


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The demo model's linear layers (Qwen2 names); the tied embedding is left alone."""


def with_lora(model: Any, rank: int) -> Any:
    """Wrap ``model`` in a peft LoRA adapter of ``rank`` on every linear layer.

    The adapter starts as a zero update (peft initialises B to 0), so step 0 samples the
    shipped model. The rollout adapter's weight sync merges the adapter into the weights
    while it sends them (and unmerges it after), so the engine serves the adapted policy
    under the base model's parameter names, without knowing about peft.
    """
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:
        raise SystemExit("--lora-rank needs peft: pip install peft") from exc

    config = LoraConfig(
        r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=list(LORA_TARGETS)
    )
    return get_peft_model(model, config)


def train_only(model: Any, spec: str) -> int:
    """Freeze every parameter whose name contains none of ``spec``'s comma-separated parts.

    Returns how many parameters stay trainable. TRL's optimizer is built over the
    parameters that still require a gradient, and the adapter's weight sync copies the
    whole state dict, so the engine serves exactly what was trained.
    """
    parts = [part.strip() for part in spec.split(",") if part.strip()]
    for name, param in model.named_parameters():
        param.requires_grad_(any(part in name for part in parts))
    kept = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if not kept:
        raise SystemExit(f"--trainable {spec!r}: no parameter name contains any of {parts}")
    return int(kept)


def train(args: argparse.Namespace, rows: list[dict[str, Any]], tools_path: Path) -> dict[str, Any]:
    """GRPO on the training rows, on-policy through the adapter; saves ``<out>/model``."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from toolrollout import RolloutConfig, SamplingParams
    from toolrollout.apps.demo import DEMO_MODEL_PATH
    from toolrollout.engines.embedded import EmbeddedEngine
    from toolrollout.integrations import trl_rollout_func
    from toolrollout.rewards import WeightedReward, exact_match, tool_error_penalty
    from toolrollout.spec import RunSpec

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(str(DEMO_MODEL_PATH))
    model = AutoModelForCausalLM.from_pretrained(str(DEMO_MODEL_PATH), dtype=torch.float32)
    trainable = args.trainable
    if args.lora_rank:
        model = with_lora(model, args.lora_rank)
        trainable = ",".join(part for part in (trainable, "lora_") if part)
    if trainable:
        kept = train_only(model, trainable)
        print(f"training {kept:,} of {sum(p.numel() for p in model.parameters()):,} parameters")
    batch = args.prompts_per_step * args.group_size
    dataset = Dataset.from_list(
        [{"prompt": {"messages": r["messages"], "answer": r["answer"]}} for r in rows]
    )
    config = RolloutConfig(
        sampling=SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature),
        max_turns=args.max_turns,
        max_response_tokens=args.max_completion_length,
        seed=args.seed,
        concurrency=batch,
    )
    terms = [
        WeightedReward("exact_match", exact_match),
        WeightedReward("tool_error_penalty", tool_error_penalty(args.tool_error_penalty)),
    ]
    engine = EmbeddedEngine(DEMO_MODEL_PATH, num_threads=args.threads, max_batch_size=batch)
    rollout = trl_rollout_func(
        engine, tokenizer,
        RunSpec(tool_config=tools_path, config=config, rewards=terms), weight_sync="auto",
    )  # fmt: skip
    versions: list[tuple[int, set[str]]] = []
    rollout_seconds: list[float] = []

    def recorded(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        started = time.perf_counter()
        out = rollout(prompts, trainer)
        rollout_seconds.append(time.perf_counter() - started)
        versions.append((trainer.state.global_step, set(out["weight_version"])))
        return out

    def toolrollout_reward(completions: list[Any], reward: list[Any], **_: Any) -> list[float]:
        """toolrollout's reward (the terms above, summed); a failed rollout scores 0."""
        return [0.0 if r is None else float(r) for r in reward]

    grpo = GRPOConfig(
        output_dir=str(args.out_dir / "trainer"),
        per_device_train_batch_size=batch,
        num_generations=args.group_size,
        max_completion_length=args.max_completion_length,
        temperature=args.temperature,
        learning_rate=args.learning_rate,
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_steps=args.steps,
        beta=args.beta,
        optim=args.optimizer,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=args.seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
        # < 1 makes TRL call get_high_entropy_mask, which entropy_masked() replaces
        top_entropy_quantile=0.5 if args.max_token_entropy > 0 else 1.0,
    )
    trainer_class = entropy_masked(GRPOTrainer, args.max_token_entropy)
    if args.positive_advantages:
        trainer_class = positive_advantages_only(trainer_class)
    trainer = trainer_class(
        model=model,
        reward_funcs=[toolrollout_reward],
        args=grpo,
        train_dataset=dataset,
        processing_class=tokenizer,
        rollout_func=recorded,
    )
    started = time.perf_counter()
    with rollout:
        trainer.train()
    seconds = time.perf_counter() - started
    stale = [(step, v) for step, v in versions if v != {str(step)}]
    if stale:
        raise RuntimeError(f"rollouts not from the current step's weights: {stale[:3]}")
    if args.lora_rank:  # the evaluation loads a plain model folder: fold the adapter in
        trainer.model.merge_and_unload().save_pretrained(str(args.out_dir / "model"))
        tokenizer.save_pretrained(str(args.out_dir / "model"))
    else:
        trainer.save_model(str(args.out_dir / "model"))
    history = [h for h in trainer.state.log_history if "reward" in h]
    return {"seconds": seconds, "rollout_seconds": rollout_seconds, "history": history}


# ----------------------------------------------------------------------------- report
def plot(history: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [int(h["step"]) for h in history]
    mean = [h["reward"] for h in history]
    std = [h.get("reward_std", 0.0) for h in history]
    zero = [h.get("frac_reward_zero_std", math.nan) for h in history]
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=120)
    ax.plot(steps, mean, marker="o", ms=3, label="mean reward")
    low = [m - s for m, s in zip(mean, std, strict=True)]
    high = [m + s for m, s in zip(mean, std, strict=True)]
    ax.fill_between(steps, low, high, alpha=0.2, label="± std within groups")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("reward (exact_match + tool_error_penalty)")
    twin = ax.twinx()
    twin.plot(steps, zero, color="tab:gray", ls="--", lw=1, label="groups with zero variance")
    entropy = [h.get("entropy", math.nan) for h in history]
    twin.plot(steps, entropy, color="tab:red", ls=":", lw=1, label="entropy (nats a token)")
    twin.set_ylim(0, 1)
    twin.set_ylabel("zero-std fraction; entropy")
    lines = ax.get_legend_handles_labels()
    more = twin.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], loc="lower right", fontsize=8)
    ax.set_title("GRPO on the demo model, python sandbox task (on-policy)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    random.seed(args.seed)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    from toolrollout.apps.demo import DEMO_MODEL_PATH
    from toolrollout.apps.eval._stats import bootstrap_difference, bootstrap_mean

    rows, heldout = build_splits(args)
    tools = sandbox_config(args.out_dir)
    print(f"{len(rows)} training prompts (train split), {args.eval_prompts} held-out prompts")
    evals: dict[str, dict[str, Any]] = {}

    def evaluate(model: Path, when: str) -> None:
        evals[f"greedy_{when}"] = run_eval(args, model, heldout, tools, f"eval_{when}")
        if args.eval_samples > 1:
            evals[f"sampled_{when}"] = run_eval(
                args, model, heldout, tools, f"eval_sampled_{when}", args.eval_samples
            )
        print(f"{when}: " + ", ".join(
            f"{kind} accuracy {statistics.fmean(evals[f'{kind}_{when}']['scores'].values()):.3f}"
            for kind in ("greedy", "sampled") if f"{kind}_{when}" in evals
        ), flush=True)  # fmt: skip

    evaluate(DEMO_MODEL_PATH, "before")
    trained = train(args, rows, tools)
    for h in trained["history"]:
        print(
            f"step {int(h['step']):3d}  reward {h['reward']:.3f}  "
            f"zero-std groups {h.get('frac_reward_zero_std', math.nan):.2f}  "
            f"entropy {h.get('entropy', math.nan):.3f}  "
            f"tool calls {h.get('tools/calls/mean', math.nan):.2f}"
        )
    evaluate(args.out_dir / "model", "after")
    results: dict[str, dict[str, Any]] = {}
    for kind in ("greedy", "sampled"):
        if f"{kind}_before" not in evals:
            continue
        before, after = evals[f"{kind}_before"], evals[f"{kind}_after"]
        diff = bootstrap_difference(after["scores"], before["scores"], seed=args.seed)
        acc = {
            when: bootstrap_mean(list(run["scores"].values()), seed=args.seed)
            for when, run in (("before", before), ("after", after))
        }
        results[kind] = {
            "accuracy": {k: [v.estimate, v.low, v.high] for k, v in acc.items()},
            "difference": [diff.estimate, diff.low, diff.high, diff.paired],
            "tools": {"before": before["tools"], "after": after["tools"]},
            "line": f"accuracy {acc['before'].estimate:.3f} -> {acc['after'].estimate:.3f}, "
            f"difference 95% CI [{diff.low:.3f}, {diff.high:.3f}]",
        }
    plot(trained["history"], args.plot or args.out_dir / "reward.png")
    total = time.perf_counter() - started
    eval_seconds = {name: run["seconds"] for name, run in evals.items()}
    summary = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "greedy": results["greedy"],
        "sampled": results.get("sampled"),
        "seconds": {
            "total": total,
            "train": trained["seconds"],
            "rollouts": sum(trained["rollout_seconds"]),
            "eval": eval_seconds,
        },
        "history": trained["history"],
        "cpu_count": os.cpu_count(),
    }
    (args.out_dir / "summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    print(
        f"wall {total:.0f} s (train {trained['seconds']:.0f}, "
        f"evals {sum(eval_seconds.values()):.0f}); summary: {args.out_dir / 'summary.json'}"
    )
    # The headline is the policy GRPO trains: samples at the training temperature. Greedy
    # decoding of the same weights comes on the line before it.
    if "sampled" in results:
        print("held-out, greedy decoding: " + results["greedy"]["line"])
        print("held-out " + results["sampled"]["line"])
    else:
        print("held-out " + results["greedy"]["line"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
