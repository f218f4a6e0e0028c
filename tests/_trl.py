"""A real TRL ``GRPOTrainer`` driving toolrollout's adapter, for the on-policy tests.

The tests that train (tests/integrations/test_trl_weight_sync.py, the real-vLLM and the
SmolLM2 ones) differ in engine, model and what they check per batch; the trainer, the
reward and the per-batch record are the same, and live here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

Record = Callable[[dict[str, Any], Any], dict[str, Any]]
"""What a test keeps of one rollout batch, from the adapter's output and the trainer."""


def tie_reward(completions: list[Any], completion_ids: list[list[int]], **_: Any) -> list[float]:
    """Differs between any two distinct samples, so every group has a non-zero advantage."""
    return [1e-2 * (sum(ids) % 97) for ids in completion_ids]


def teacher_forced_gap(model: Any, out: dict[str, Any], temperature: float) -> float:
    """Largest |engine logprob - policy logprob| over the model tokens of a batch."""
    import torch

    worst = 0.0
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for prompt, ids, mask, logprobs in zip(
                out["prompt_ids"], out["completion_ids"], out["env_mask"], out["logprobs"],
                strict=True,
            ):  # fmt: skip
                full = torch.tensor([list(prompt) + list(ids)])
                logits = model(input_ids=full).logits[0, len(prompt) - 1 : -1].float()
                scored = torch.log_softmax(logits / temperature, dim=-1)
                policy = scored.gather(1, torch.tensor(ids)[:, None])[:, 0]
                engine = torch.tensor(logprobs, dtype=torch.float32)
                trained = torch.tensor(mask, dtype=torch.bool)
                if trained.any():
                    worst = max(worst, float((policy - engine)[trained].abs().max()))
    finally:
        model.train(was_training)
    return worst


def train_grpo(
    model: Any,
    tokenizer: Any,
    rollout: Any,
    prompts: list[Any],
    tmp_path: Path,
    record: Record,
    **config: Any,
) -> tuple[Any, list[dict[str, Any]]]:
    """Train ``model`` with GRPO on ``prompts`` (message lists), sampling through the
    adapter ``rollout`` on the CPU; returns the trainer and one record per rollout batch:
    ``{"step": the trainer's step when it was sampled, **record(out, trainer)}``.
    ``config`` overrides GRPOConfig's fields (``max_steps``, ``temperature``, ...)."""
    datasets = pytest.importorskip("datasets")
    trl = pytest.importorskip("trl")
    batches: list[dict[str, Any]] = []

    def recording(batch: list[Any], trainer: Any) -> dict[str, Any]:
        out: dict[str, Any] = rollout(batch, trainer)
        batches.append({"step": trainer.state.global_step, **record(out, trainer)})
        return out

    settings: dict[str, Any] = {
        "output_dir": str(tmp_path / "out"), "per_device_train_batch_size": 4,
        "num_generations": 4, "max_completion_length": 64, "beta": 0.0, "logging_steps": 1,
        "save_strategy": "no", "report_to": "none", "use_cpu": True, "bf16": False, "seed": 0,
        "dataloader_num_workers": 0, "disable_tqdm": True, **config,
    }  # fmt: skip
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=[tie_reward],
        args=trl.GRPOConfig(**settings),
        train_dataset=datasets.Dataset.from_list([{"prompt": p} for p in prompts]),
        processing_class=tokenizer,
        rollout_func=recording,
    )
    with rollout:
        trainer.train()
    return trainer, batches
