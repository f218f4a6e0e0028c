"""A few on-policy GRPO steps on SmolLM2 through the TRL adapter and the embedded engine.

What is checked is the machinery on a real pretrained model, not learning: every rollout
batch carries the trainer's step as its weight version (the trained weights reached the
engine before the batch was sampled), each step's gradient is non-zero and the trained
layers really moved, and every trajectory's ids equal a fresh render of its messages (no
drift with the real 49,152-token tokenizer). The reward breaks ties by the sampled ids so
every group has a non-zero advantage; the real task's reward is in examples/grpo_smollm.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests._trl import train_grpo

from toolrollout import RolloutConfig, SamplingParams
from toolrollout.integrations import trl_rollout_func
from toolrollout.spec import RunSpec
from toolrollout.tools import calculator_tool

STEPS = 2
PROMPTS = [
    "What is 347 * 29?",
    "Compute 812 times 47.",
]
TOP = "model.layers.29."
"""The one decoder layer trained (with the final norm): keeps the backward pass short."""


@pytest.mark.slow
def test_grpo_steps_are_on_policy_with_a_gradient(
    smollm2_dir: Path, smollm2_tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch
    from transformers import AutoModelForCausalLM

    from toolrollout.engines.embedded import EmbeddedEngine

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32)
    for name, param in model.named_parameters():
        param.requires_grad_(name.startswith((TOP, "model.norm.")))
    start = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    system = {"role": "system", "content": "You are a helpful assistant."}
    engine = EmbeddedEngine(smollm2_dir, num_threads=2, max_batch_size=4)
    config = RolloutConfig(
        sampling=SamplingParams(max_new_tokens=12, temperature=1.0), max_turns=2, seed=0
    )
    rollout = trl_rollout_func(
        engine, smollm2_tokenizer, RunSpec(tools=[calculator_tool()], config=config)
    )

    def record(out: dict[str, Any], trainer: Any) -> dict[str, Any]:
        return {
            "versions": set(out["weight_version"]),
            "drift": [t.metrics["drift_mismatches"] for t in rollout.last_trajectories],
        }

    trainer, batches = train_grpo(
        model, smollm2_tokenizer, rollout,
        [[system, {"role": "user", "content": q}] for q in PROMPTS], tmp_path, record,
        per_device_train_batch_size=2, num_generations=2, max_completion_length=32,
        temperature=1.0, max_steps=STEPS, learning_rate=1e-3,
    )  # fmt: skip
    assert trainer.state.global_step == STEPS
    assert [b["step"] for b in batches] == list(range(STEPS))
    for b in batches:
        assert b["versions"] == {str(b["step"])}, b
        assert b["drift"] and not any(b["drift"]), b
    logged = [h for h in trainer.state.log_history if "grad_norm" in h]
    assert len(logged) == STEPS
    assert all(float(h["grad_norm"]) > 0 for h in logged), logged
    moved = max(
        float((p.detach() - start[n]).abs().max())
        for n, p in trainer.model.named_parameters()
        if n in start
    )
    assert moved > 0, "no trained weight changed"
