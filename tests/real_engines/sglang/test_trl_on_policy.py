"""The TRL adapter on-policy against the real SGLang server.

A real ``GRPOTrainer`` takes three optimizer steps on the demo model with
``trl_rollout_func`` pointed at the session's float32 SGLang server. Before each rollout
batch the adapter saves the trainer's weights and has SGLang load them with
``update_weights_from_disk`` (``weight_version`` = the step). The checks are those of
tests/integrations/test_trl_weight_sync.py against ``toolrollout serve``: every turn
carries the step that sampled it, the engine's logprobs agree with the trainer's policy at
that step (teacher forcing), and the initial weights no longer explain the samples.
The server gets the demo weights and version back afterwards.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from tests.integrations.test_trl_weight_sync import STEPS, _check_on_policy, _train
from tests.real_engines.sglang._launch import DEMO_MODEL, LIMIT, SGLangServer
from toolrollout.engines import SGLangClient

pytestmark = [pytest.mark.real_engine, pytest.mark.slow, pytest.mark.timeout(LIMIT)]


async def _restore(url: str, version: str) -> None:
    async with SGLangClient(url) as client:
        await client.update_weights_from_disk(str(DEMO_MODEL), weight_version=version)


def test_each_steps_weights_reach_the_real_server(
    sglang_fp32: SGLangServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(DEMO_MODEL))
    weights = tmp_path / "ckpt"
    try:
        batches = _train(sglang_fp32.url, tokenizer, tmp_path, weights_dir=weights)
    finally:
        anyio.run(_restore, sglang_fp32.url, "default")
    _check_on_policy(batches)
    paths = [Path(b["sync"].path) for b in batches]
    assert [p.name for p in paths] == [f"step-{k}" for k in range(STEPS)]
    assert sorted(p.name for p in weights.iterdir()) == [f"step-{STEPS - 1}"]
