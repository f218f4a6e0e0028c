"""The TRL adapter on-policy against a real vLLM server, given nothing but its URL.

A real ``GRPOTrainer`` takes three optimizer steps on the demo model with
``trl_rollout_func(url, ...)``. Before each rollout batch the adapter saves the trainer's
weights, has vLLM reload them (the folder validated first, then the prefix cache reset and
the version labelled), so each batch must be explained by the trainer's policy of that
moment (float32 teacher forcing at the sampling temperature, ~1e-4), every model turn must
carry the step that sampled it, and the initial weights must no longer explain the later
batches.

The demo model ties its output head to its input embeddings, and vLLM's CPU reload leaves
a tied head on its old weights (``VLLMClient`` refuses that reload: test_entry_points.py);
so the session's untied copy of the demo model (``vllm_untied``) serves it, the trainer
trains that copy, and the server gets its start-up weights back afterwards.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests._trl import teacher_forced_gap, train_grpo
from tests.integrations.test_trl_weight_sync import AGREE, MOVED, STEPS, TEMPERATURE
from tests.real_engines.vllm._server import VLLMServer
from toolrollout import RolloutConfig, SamplingParams
from toolrollout.apps.demo import load_demo_prompts
from toolrollout.engines._factory import connect
from toolrollout.integrations import trl_rollout_func
from toolrollout.spec import RunSpec
from toolrollout.tools import calculator_tool

pytestmark = [pytest.mark.real_engine, pytest.mark.slow, pytest.mark.timeout(900)]
"""A real server starts in 1-4 minutes on a loaded machine (setup counts toward the limit)."""


def _weights(url: str, folder: Path, version: str | None) -> str | None:
    """Load ``folder`` with ``version`` (when given); the version served afterwards."""

    async def run() -> str | None:
        async with await connect([url]) as engine:
            if version is not None:
                await engine.update_weights_from_disk(folder, weight_version=version)
            return (await engine.info()).weight_version

    return anyio.run(run)


def test_each_rollout_batch_is_sampled_by_the_trainers_current_weights(
    vllm_untied: VLLMServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    untied_server = vllm_untied
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(untied_server.model), dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(untied_server.model))
    initial = copy.deepcopy(model)
    config = RolloutConfig(
        sampling=SamplingParams(max_new_tokens=24, temperature=TEMPERATURE), max_turns=2, seed=0
    )
    rollout = trl_rollout_func(
        untied_server.url, tokenizer, RunSpec(tools=[calculator_tool()], config=config),
        weights_dir=tmp_path / "weights",
    )  # fmt: skip
    assert type(rollout.engine).__name__ == "VLLMClient"  # found from the URL alone

    def record(out: dict[str, Any], trainer: Any) -> dict[str, Any]:
        return {
            "turn_versions": {v for turns in out["weight_versions"] for v in turns},
            "gap": teacher_forced_gap(trainer.model, out, TEMPERATURE),
            "gap_initial": teacher_forced_gap(initial, out, TEMPERATURE),
            "distinct": len({tuple(ids) for ids in out["completion_ids"]}),
        }

    prompts = [r["messages"] for r in load_demo_prompts()[:STEPS]]
    before = _weights(untied_server.url, untied_server.model, None)
    try:
        trainer, batches = train_grpo(
            model, tokenizer, rollout, prompts, tmp_path, record,
            temperature=TEMPERATURE, max_steps=STEPS, learning_rate=3e-3,
        )  # fmt: skip
    finally:  # the session's server goes back to its start-up weights for the next modules
        restored = _weights(untied_server.url, untied_server.model, before or "default")
    assert restored == (before or "default")
    assert [b["step"] for b in batches] == list(range(STEPS))
    for b in batches:
        assert b["turn_versions"] == {str(b["step"])}, b  # every turn, not just the row
        assert b["gap"] < AGREE, f"step {b['step']}: rollouts are off the trainer's policy"
    # A group of identical samples has no advantage: some step before the last must have
    # had a gradient for the check below to mean anything (a peaked first group can come
    # out identical by chance).
    assert any(b["distinct"] > 1 for b in batches[:-1]), "every group's samples were the same"
    assert max(b["gap_initial"] for b in batches[1:]) > MOVED  # the served weights moved
    logged = [h for h in trainer.state.log_history if "rollout/weight_sync/seconds" in h]
    assert len(logged) == STEPS
