"""On-policy TRL: after optimizer step k the engine samples with step k's weights.

A real ``GRPOTrainer`` takes three optimizer steps on the demo model. Each rollout batch is
teacher-forced through the trainer's policy *as it is when the batch is generated*
(Hugging Face forward pass, logits / temperature, log-softmax): the engine's sampled-token
logprobs must agree with it to ~1e-4, every trajectory must carry the trainer's step as
its weight version, and the same tokens scored by the initial weights must be clearly
different (so the check would catch an engine left on the initial weights). Run once with
an in-process ``EmbeddedEngine`` and once against ``toolrollout serve`` in its own
process, loading checkpoints from its ``--weights-dir``.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests._processes import free_port, stop, wait_http
from tests._trl import teacher_forced_gap, train_grpo

from toolrollout import RolloutConfig, SamplingParams
from toolrollout.apps.demo import DEMO_MODEL_PATH, load_demo_prompts
from toolrollout.integrations import trl_rollout_func
from toolrollout.spec import RunSpec
from toolrollout.tools import calculator_tool

TEMPERATURE = 1.6
"""High enough that a group's samples differ from the first step on (at 1.2 the demo model
often gave four identical samples, so no gradient, and the check below depended on which
seeds a step drew)."""
STEPS = 3
AGREE = 2e-4
"""Engine vs teacher forcing on the same weights (float32; batched vs one-row forward)."""
MOVED = 1e-2
"""Least largest gap between the initial weights' logprobs and the served ones after a step."""


def _train(engine: Any, tokenizer: Any, tmp_path: Path, **adapter: Any) -> list[dict[str, Any]]:
    """Three GRPO steps; per rollout batch: step, versions, gaps to the current/initial policy."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(DEMO_MODEL_PATH), dtype=torch.float32)
    initial = copy.deepcopy(model)
    config = RolloutConfig(
        sampling=SamplingParams(max_new_tokens=24, temperature=TEMPERATURE),
        max_turns=2,
        seed=0,
    )
    rollout = trl_rollout_func(
        engine, tokenizer, RunSpec(tools=[calculator_tool()], config=config), **adapter
    )

    def record(out: dict[str, Any], trainer: Any) -> dict[str, Any]:
        return {
            "versions": set(out["weight_version"]),
            "gap": teacher_forced_gap(trainer.model, out, TEMPERATURE),
            "gap_initial": teacher_forced_gap(initial, out, TEMPERATURE),
            "distinct": len({tuple(ids) for ids in out["completion_ids"]}),
            "sync": rollout.last_sync,
        }

    prompts = [r["messages"] for r in load_demo_prompts()[:STEPS]]
    trainer, batches = train_grpo(
        model, tokenizer, rollout, prompts, tmp_path, record,
        temperature=TEMPERATURE, max_steps=STEPS, learning_rate=3e-3,
    )  # fmt: skip
    assert trainer.state.global_step == STEPS
    logged = [h for h in trainer.state.log_history if "rollout/weight_sync/seconds" in h]
    assert len(logged) == STEPS, "the sync cost is not in the trainer's log every step"
    assert all(h["rollout/weight_sync/seconds"] > 0 for h in logged)
    return batches


def _check_on_policy(batches: list[dict[str, Any]]) -> None:
    assert [b["step"] for b in batches] == list(range(STEPS))
    for b in batches:
        assert b["versions"] == {str(b["step"])}, b
        assert b["gap"] < AGREE, f"step {b['step']}: rollouts are off the trainer's policy"
    # A group of identical samples has no advantage: some step before the last must have
    # had a gradient for the check below to mean anything (SGLang ignores the seeds, so a
    # peaked first group can come out identical by chance).
    assert any(b["distinct"] > 1 for b in batches[:-1]), "every group's samples were the same"
    # The weights really moved: the initial policy no longer explains the samples.
    assert max(b["gap_initial"] for b in batches[1:]) > MOVED


@pytest.fixture
def trl_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    pytest.importorskip("trl")
    pytest.importorskip("datasets")


@pytest.mark.slow
@pytest.mark.usefixtures("trl_env")
def test_embedded_engine_serves_each_steps_weights(tmp_path: Path, demo_tokenizer: Any) -> None:
    from toolrollout.engines.embedded import EmbeddedEngine

    engine = EmbeddedEngine(DEMO_MODEL_PATH, num_threads=1, max_batch_size=8)
    batches = _train(engine, demo_tokenizer, tmp_path)
    _check_on_policy(batches)
    assert all(b["sync"].path is None for b in batches)  # in process: nothing written


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """``toolrollout serve`` in its own process, loading weights from ``tmp_path/ckpt``."""
    weights = tmp_path / "ckpt"
    weights.mkdir()
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolrollout", "serve", "--port", str(port), "--threads", "1",
         "--max-batch-size", "8", "--log-level", "warning", "--weights-dir", str(weights)],
        env=env,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/health", 300, proc)  # torch imports slowly on a busy machine
        yield url, weights
    finally:
        stop(proc)


@pytest.mark.slow
@pytest.mark.usefixtures("trl_env")
def test_toolrollout_serve_loads_each_steps_checkpoint(
    tmp_path: Path, demo_tokenizer: Any, served: tuple[str, Path]
) -> None:
    url, weights = served
    batches = _train(url, demo_tokenizer, tmp_path, weights_dir=weights)
    _check_on_policy(batches)
    paths = [Path(b["sync"].path) for b in batches]
    assert [p.name for p in paths] == [f"step-{k}" for k in range(STEPS)]
    assert all(p.parent == weights.resolve() for p in paths)
    # Only the newest checkpoint is kept.
    assert sorted(p.name for p in weights.iterdir()) == [f"step-{STEPS - 1}"]
