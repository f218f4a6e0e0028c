"""examples/grpo_python.py runs end to end: eval, on-policy GRPO steps, eval, result line.

Tiny settings (one optimizer step, a handful of prompts) so it checks the wiring, not the
learning: the published run and its figures are in docs/trainers.md.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "grpo_python.py"
LAST_LINE = re.compile(
    r"^held-out accuracy (\d+\.\d+) -> (\d+\.\d+), "
    r"difference 95% CI \[(-?\d+\.\d+), (-?\d+\.\d+)\]$"
)


@pytest.mark.slow
def test_grpo_example_runs_and_prints_the_result_line(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), *sys.path])}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--steps", "1", "--eval-prompts", "4",
         "--train-prompts", "8", "--prompts-per-step", "2", "--group-size", "2",
         "--max-new-tokens", "64", "--out-dir", str(out)],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    match = LAST_LINE.match(last)
    assert match, f"last line not in the published format: {last!r}"
    before, after, low, high = (float(g) for g in match.groups())
    assert 0.0 <= before <= 1.0 and 0.0 <= after <= 1.0
    assert -1.0 <= low <= high <= 1.0
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert len(summary["history"]) == 1
    # TRL called the entropy-mask hook of the default recipe (the key is logged there)
    assert 0.0 < summary["history"][0]["entropy_mask/kept"] <= 1.0
    # the sampled evaluation (the headline, last line) comes after the greedy one
    sampled = summary["sampled"]["accuracy"]
    assert all(0.0 <= v[0] <= 1.0 for v in sampled.values())
    assert summary["sampled"]["line"] in last
    assert done.stdout.strip().splitlines()[-2].startswith("held-out, greedy decoding: accuracy")
    assert (out / "reward.png").stat().st_size > 0
    # held-out and training programs are disjoint (the script also refuses otherwise)
    held = {json.loads(line)["code"] for line in (out / "heldout.jsonl").open()}
    train = {json.loads(line)["code"] for line in (out / "train.jsonl").open()}
    assert held and train and not held & train


def _example() -> object:
    spec = importlib.util.spec_from_file_location("grpo_python", SCRIPT)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


def test_positive_advantages_clip_only_the_negative_rows() -> None:
    torch = pytest.importorskip("torch")
    example: Any = _example()

    class Base:
        def _compute_loss(self, model: object, inputs: dict[str, Any]) -> Any:
            return inputs["advantages"]

    trainer = example.positive_advantages_only(Base)()
    inputs = {"advantages": torch.tensor([1.5, -0.5, 0.0, -2.0]), "other": 1}
    assert trainer._compute_loss(None, inputs).tolist() == [1.5, 0.0, 0.0, 0.0]
    assert inputs["advantages"].tolist() == [1.5, -0.5, 0.0, -2.0]  # the batch is not changed


def test_trainable_freezes_every_other_parameter() -> None:
    torch = pytest.importorskip("torch")
    example: Any = _example()
    model = torch.nn.ModuleDict(
        {
            "norm": torch.nn.LayerNorm(4),
            "proj": torch.nn.Linear(4, 4),
            "final_norm": torch.nn.LayerNorm(4),
        }
    )
    assert example.train_only(model, "norm") == 16
    trained = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trained == {"norm.weight", "norm.bias", "final_norm.weight", "final_norm.bias"}
    assert example.train_only(model, "proj.weight, norm.bias") == 16 + 4 + 4
    with pytest.raises(SystemExit, match="no parameter name contains"):
        example.train_only(model, "attention")


def test_entropy_mask_keeps_only_confident_model_tokens() -> None:
    torch = pytest.importorskip("torch")
    example: Any = _example()

    class Base:
        def __init__(self) -> None:
            self._metrics: dict[str, dict[str, list[float]]] = {"train": defaultdict(list)}

    trainer = example.entropy_masked(Base, 1.0)()
    entropies = torch.tensor([[0.1, 1.5, 0.99, 3.0], [0.0, 0.2, 2.0, 0.5]])
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1]])
    kept = trainer.get_high_entropy_mask(entropies, mask, 0.5)
    assert kept.tolist() == [[True, False, True, False], [False, True, False, True]]
    assert trainer._metrics["train"]["entropy_mask/kept"] == [4 / 6]
    assert example.entropy_masked(Base, 0.0) is Base  # 0 turns the mask off


def test_lora_adapter_trains_only_its_own_weights_and_starts_at_the_shipped_model() -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    from toolrollout.apps.demo import DEMO_MODEL_PATH
    from toolrollout.integrations._weight_sync import policy_state_dict

    example: Any = _example()
    base = AutoModelForCausalLM.from_pretrained(str(DEMO_MODEL_PATH), dtype=torch.float32)
    shipped = {k: v.clone() for k, v in base.state_dict().items()}
    model = example.with_lora(base, 4)
    kept = example.train_only(model, "lora_")
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    # rank 4 on every linear layer of both blocks: 4 x (in + out) each
    assert kept == 2 * 4 * sum(
        m.in_features + m.out_features
        for name, m in base.named_modules()
        if name.split(".")[-1] in example.LORA_TARGETS and name.startswith("model.layers.0.")
    )
    trainer = type("T", (), {"model": model})()
    with policy_state_dict(trainer) as state:  # what the engine is sent: base names
        assert set(state) == set(shipped)
        assert all(torch.equal(state[k], shipped[k]) for k in shipped)  # B starts at 0
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.add_(0.01)
    with policy_state_dict(trainer) as state:
        moved = [k for k in shipped if not torch.equal(state[k], shipped[k])]
    assert moved and all(k.endswith("proj.weight") for k in moved)
