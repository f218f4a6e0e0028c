"""A few on-policy GRPO steps on SmolLM2 through the TRL adapter, on the embedded engine and
on the real vLLM server.

What is checked is the machinery on a real pretrained model, not learning: every rollout
batch carries the trainer's step as its weight version (the trained weights reached the
engine before the batch was sampled), each step with unequal rewards has a non-zero
gradient and the trained layers really moved, every trajectory's ids equal a fresh render
of its messages (no drift with the real 49,152-token tokenizer), and each batch is
explained by the trainer's weights of that step (teacher forcing at the sampling
temperature). The reward breaks ties by the sampled ids, so a group almost always has a
non-zero advantage; the real task's reward is in examples/grpo_smollm.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from tests._trl import teacher_forced_gap, train_grpo
from tests.integrations.test_trl_weight_sync import AGREE
from tests.real_engines.vllm._server import VLLMServer, untie, vllm_python

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
TEMPERATURE = 1.0


def two_steps(engine: Any, model_dir: Path, tokenizer: Any, tmp_path: Path) -> None:
    """Two GRPO steps from ``model_dir`` sampling on ``engine`` (an engine or a URL)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    for name, param in model.named_parameters():
        param.requires_grad_(name.startswith((TOP, "model.norm.")))
    start = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    system = {"role": "system", "content": "You are a helpful assistant."}
    config = RolloutConfig(
        sampling=SamplingParams(max_new_tokens=12, temperature=TEMPERATURE), max_turns=2, seed=0
    )
    rollout = trl_rollout_func(
        engine, tokenizer, RunSpec(tools=[calculator_tool()], config=config),
        weights_dir=tmp_path / "weights",
    )  # fmt: skip

    def record(out: dict[str, Any], trainer: Any) -> dict[str, Any]:
        return {
            "versions": {v for turns in out["weight_versions"] for v in turns},
            "drift": [t.metrics["drift_mismatches"] for t in rollout.last_trajectories],
            "gap": teacher_forced_gap(trainer.model, out, TEMPERATURE),
        }

    trainer, batches = train_grpo(
        model, tokenizer, rollout,
        [[system, {"role": "user", "content": q}] for q in PROMPTS], tmp_path, record,
        per_device_train_batch_size=2, num_generations=2, max_completion_length=32,
        temperature=TEMPERATURE, max_steps=STEPS, learning_rate=1e-3,
    )  # fmt: skip
    assert trainer.state.global_step == STEPS
    assert [b["step"] for b in batches] == list(range(STEPS))
    for b in batches:
        assert b["versions"] == {str(b["step"])}, b
        assert b["drift"] and not any(b["drift"]), b
        assert b["gap"] < AGREE, f"step {b['step']}: rollouts are off the trainer's policy"
    logged = [h for h in trainer.state.log_history if "grad_norm" in h]
    assert len(logged) == STEPS
    # A group whose rewards are all equal has no advantage, hence no gradient (the tie
    # reward can collide for two different samples, and a seeded engine repeats it).
    assert float(logged[0]["frac_reward_zero_std"]) < 1, logged[0]
    for h in logged:
        assert float(h["grad_norm"]) > 0 or float(h["frac_reward_zero_std"]) == 1, h
    moved = max(
        float((p.detach() - start[n]).abs().max())
        for n, p in trainer.model.named_parameters()
        if n in start
    )
    assert moved > 0, "no trained weight changed"


@pytest.mark.slow
def test_grpo_steps_are_on_policy_with_a_gradient(
    smollm2_dir: Path, smollm2_tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    from toolrollout.engines.embedded import EmbeddedEngine

    engine = EmbeddedEngine(smollm2_dir, num_threads=2, max_batch_size=4)
    two_steps(engine, smollm2_dir, smollm2_tokenizer, tmp_path)


@pytest.mark.slow
@pytest.mark.real_engine
@pytest.mark.timeout(900)
def test_grpo_steps_on_the_real_vllm_are_on_policy(
    smollm2_dir: Path, smollm2_tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same steps with a real vLLM server sampling and reloading the trainer's weights
    (an untied copy of the model: vLLM's CPU reload cannot update a tied head)."""
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    vllm_python()
    served = tmp_path / "served"
    shutil.copytree(smollm2_dir, served)
    untie(served)
    server = VLLMServer(served, tmp_path / "vllm.log", extra_args=("--no-enable-chunked-prefill",))
    server.start()
    try:
        two_steps(server.url, served, smollm2_tokenizer, tmp_path)
    finally:
        server.stop()
