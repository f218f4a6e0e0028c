"""examples/grpo_python.py runs end to end: eval, on-policy GRPO steps, eval, result line.

Tiny settings (one optimizer step, a handful of prompts) so it checks the wiring, not the
learning: the published run and its figures are in docs/trainers.md.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

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
    assert (out / "reward.png").stat().st_size > 0
    # held-out and training programs are disjoint (the script also refuses otherwise)
    held = {json.loads(line)["code"] for line in (out / "heldout.jsonl").open()}
    train = {json.loads(line)["code"] for line in (out / "train.jsonl").open()}
    assert held and train and not held & train
