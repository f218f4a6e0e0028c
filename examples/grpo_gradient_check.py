"""How much of one GRPO step is signal? Gradient agreement between independent batches.

    python examples/grpo_gradient_check.py                # the figures in docs/trainers.md
    python examples/grpo_gradient_check.py --prompts 4 --group-size 4 --out-dir /tmp/check

Samples four batches with the demo model and the python sandbox task, as
``examples/grpo_python.py`` does (same adapter, rewards and budgets, no training):

* ``A`` and ``B``: the same training prompts, different sampling seeds;
* ``C``: other training prompts;
* ``H``: prompts of the held-out split.

For each batch it computes the gradient of TRL's on-policy GRPO loss (``dapo``, one
iteration, so the ratio is 1: minus the group-normalized advantage times the summed
logprob of the model's tokens, over the batch's model tokens), then prints the cosine
between every pair. Two independent batches of the *same* prompts estimate the same
expected gradient, so ``cos(A, B)`` is about ``|signal|^2 / (|signal|^2 + |noise|^2)`` of
one batch; ``cos(A, C)`` and ``cos(A, H)`` say whether what one batch teaches carries over
to other prompts. ``sign`` rows do the same for the signs of the gradient, the direction of
Adam's first step.

``--entropy-below X`` also prints, for the same batches, the cosines with the loss
restricted to model tokens where the policy's entropy is below X nats (the rest masked): a
way to see how much of the noise comes from positions where the policy is near uniform.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

EXAMPLES = Path(__file__).resolve().parent


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=16, help="prompts per batch")
    p.add_argument("--group-size", type=int, default=8, help="samples per prompt")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--entropy-below", type=float, default=None)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out-dir", type=Path, default=Path("grpo_gradient_check_out"))
    return p.parse_args(argv)


def _example() -> Any:
    """``examples/grpo_python.py`` as a module (its rows, sandbox config and defaults)."""
    spec = importlib.util.spec_from_file_location("grpo_python", EXAMPLES / "grpo_python.py")
    if spec is None or spec.loader is None:
        raise RuntimeError("cannot load examples/grpo_python.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sample_batches(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The four batches: ids, env masks and rewards, one row per trajectory."""
    import torch
    from transformers import AutoTokenizer

    from toolrollout import RolloutConfig, SamplingParams
    from toolrollout.apps.demo import DEMO_MODEL_PATH
    from toolrollout.apps.demo.code_tasks import generate_code_tasks
    from toolrollout.engines.embedded import EmbeddedEngine
    from toolrollout.integrations import trl_rollout_func
    from toolrollout.rewards import WeightedReward, exact_match, tool_error_penalty
    from toolrollout.spec import RunSpec
    from toolrollout.tools import load_tool_config

    example = _example()
    defaults = example.parse_args([])
    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(str(DEMO_MODEL_PATH))
    tools = load_tool_config(example.sandbox_config(args.out_dir))
    terms = [
        WeightedReward("exact_match", exact_match),
        WeightedReward("tool_error_penalty", tool_error_penalty(defaults.tool_error_penalty)),
    ]
    base = args.seed + example.TRAIN_SEED_OFFSET
    plans = {  # name: (task seed, split); every call of the runner samples with new seeds
        "A": (base, "train"),
        "B": (base, "train"),
        "C": (base + 1, "train"),
        "H": (base + 2, "heldout"),
    }
    size = args.prompts * args.group_size
    engine = EmbeddedEngine(DEMO_MODEL_PATH, num_threads=args.threads, max_batch_size=size)
    config = RolloutConfig(
        sampling=SamplingParams(
            max_new_tokens=defaults.max_new_tokens, temperature=args.temperature
        ),
        max_turns=defaults.max_turns,
        max_response_tokens=defaults.max_completion_length,
        seed=args.seed,
        concurrency=size,
    )
    batches: dict[str, dict[str, Any]] = {}
    with trl_rollout_func(
        engine, tokenizer, RunSpec(tools=tools, config=config, rewards=terms), weight_sync="off"
    ) as rollout:
        for name, (task_seed, split) in plans.items():
            tasks = generate_code_tasks(args.prompts, seed=task_seed, split=split)
            prompts = [
                {"messages": row["messages"], "answer": row["answer"]}
                for row in (example._row(name, i, t) for i, t in enumerate(tasks))
                for _ in range(args.group_size)
            ]
            out = rollout(prompts)
            rewards = [0.0 if r is None else float(r) for r in out["reward"]]
            batches[name] = {**out, "reward": rewards}
            mean = sum(rewards) / len(rewards)
            print(f"batch {name}: {split} prompts, mean reward {mean:.3f}", flush=True)
    return batches


def gradient(
    model: Any, batch: dict[str, Any], args: argparse.Namespace, below: float | None = None
) -> Any:
    """Flat gradient of the on-policy GRPO (dapo) loss of one batch; with ``below``, only
    model tokens where the policy's entropy is below that many nats count."""
    import torch

    rewards = torch.tensor(batch["reward"]).view(-1, args.group_size)
    advantages = (rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4)
    advantages = advantages.view(-1)
    model.zero_grad()
    tokens = 0.0
    rows = list(zip(batch["prompt_ids"], batch["completion_ids"], batch["env_mask"], strict=True))
    for i, (prompt, completion, mask) in enumerate(rows):
        ids = torch.tensor([list(prompt) + list(completion)])
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1] / args.temperature
        logps = torch.log_softmax(logits, -1)
        taken = logps.gather(-1, torch.tensor(completion)[:, None])[:, 0]
        keep = torch.tensor(mask, dtype=torch.float32)
        if below is not None:
            entropy = -(logps.exp() * logps).sum(-1).detach()
            keep = keep * (entropy < below).float()
        tokens += float(sum(mask))
        (-(advantages[i] * (taken * keep).sum())).backward()
    return torch.cat([p.grad.flatten() / max(tokens, 1.0) for p in model.parameters()])


def cosine(a: Any, b: Any) -> float:
    import torch

    return float(torch.dot(a, b) / (a.norm() * b.norm()).clamp(min=1e-12))


def main(argv: Sequence[str] | None = None) -> int:
    import torch
    from transformers import AutoModelForCausalLM

    from toolrollout.apps.demo import DEMO_MODEL_PATH

    args = parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    batches = sample_batches(args)
    model = AutoModelForCausalLM.from_pretrained(str(DEMO_MODEL_PATH), dtype=torch.float32)
    tables = [("all model tokens", None)]
    if args.entropy_below is not None:
        tables.append((f"tokens with entropy < {args.entropy_below} nats", args.entropy_below))
    for title, below in tables:
        grads = {name: gradient(model, batch, args, below) for name, batch in batches.items()}
        print(f"{title}: " + ", ".join(f"|g_{n}| {float(g.norm()):.4f}" for n, g in grads.items()))
        for a, b in itertools.combinations(grads, 2):
            print(
                f"  cos(g_{a}, g_{b}) = {cosine(grads[a], grads[b]):+.3f}   "
                f"sign: {cosine(grads[a].sign(), grads[b].sign()):+.3f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
