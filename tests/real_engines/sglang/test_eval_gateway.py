"""``toolrollout eval`` and ``toolrollout gateway`` on the real SGLang server.

Both commands are run as a user runs them, with ``--engine-url`` pointing at the
session's float32 server. eval's reported figures are recomputed from its trajectory
files (the same recount as tests/cli/test_eval_cli.py); the gateway's recorded row is
rebuilt token for token from its messages (as tests/gateway/test_gateway_cli.py does
against the embedded engine). Every model token carries the real server's logprob and
weight version.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest

from tests.cli.test_eval_cli import direct
from tests.gateway.conftest import rebuilt
from tests.gateway.test_gateway_cli import _runs
from tests.real_engines._gateway import record_sdk_session
from tests.real_engines.sglang._launch import DEMO_MODEL, LIMIT, SGLangServer
from toolrollout.apps.demo import load_demo_prompts
from toolrollout.chat import ChatFormat
from toolrollout.rollout import TokenSpan, Trajectory, TrajectoryStatus
from toolrollout.tools.calculator import CALCULATOR_TOOL

pytestmark = [pytest.mark.real_engine, pytest.mark.slow, pytest.mark.timeout(LIMIT)]

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "160"}


def _served_version(url: str) -> str:
    return str(httpx.get(f"{url}/model_info", timeout=10).json()["weight_version"])


def test_eval_on_the_real_server(sglang_fp32: SGLangServer, tmp_path: Path) -> None:
    data = tmp_path / "heldout.jsonl"
    with data.open("w") as fh:
        for i, row in enumerate(load_demo_prompts()[:4]):
            fh.write(json.dumps({**row, "data_source": "mul" if i % 2 else "add"}) + "\n")
    proc = subprocess.run(
        [sys.executable, "-m", "toolrollout", "eval", "--engine-url", sglang_fp32.url,
         "--dataset", str(data), "--n", "2", "--sampled", "--seed", "5",
         "--max-new-tokens", "40", "--max-turns", "3", "--baseline", "single-turn",
         "--report-to", "none", "--out-dir", "out"],
        cwd=tmp_path, capture_output=True, text=True, env=ENV, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "out"
    payload = json.loads((out / "metrics.json").read_text())
    for label, file in (("tools", "trajectories.parquet"), ("single-turn", "single_turn.parquet")):
        expected = direct(out / file)
        got = payload["runs"][label]["metrics"]
        for key in [k for k in expected if "/" in k]:
            assert got[key] == pytest.approx(expected[key], abs=1e-6), (label, key)
    tools = direct(out / "trajectories.parquet")
    # The demo model served by SGLang in float32 still uses its calculator and answers.
    assert tools["tools/calls/mean"] >= 0.8 and tools["eval/accuracy"] >= 0.5
    version = _served_version(sglang_fp32.url)
    for row in pq.read_table(out / "trajectories.parquet").to_pylist():
        assert not row["failed"], row["error"]
        model = [lp for lp, m in zip(row["rollout_logprobs"], row["loss_mask"], strict=True) if m]
        assert model and all(lp < 0.0 for lp in model)  # the server's logprob on each
        metrics = json.loads(row["metrics"])
        assert {v for _, _, v in metrics["weight_versions"]} == {version}, metrics
    assert "## tools: by data source" in (out / "report.md").read_text()


def test_the_gateway_records_an_sdk_agent_on_the_real_server(
    sglang_fp32: SGLangServer, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    _, recorded = record_sdk_session(
        sglang_fp32.url, tmp_path / "sessions.parquet", temperature=0.0
    )
    version = _served_version(sglang_fp32.url)
    assert recorded["weight_version"] == version  # the gateway keeps the row's version only
    spans, at = [], 0
    for masked, length in _runs(recorded["loss_mask"]):
        ids = tuple(recorded["response_ids"][at : at + length])
        lps = tuple(recorded["rollout_logprobs"][at : at + length])
        spans.append(TokenSpan("model" if masked else "tool", ids, lps))
        at += length
    trajectory = Trajectory(
        uid="x", group_id="g", prompt_index=0, sample_index=0,
        prompt_ids=tuple(recorded["prompt_ids"]), spans=tuple(spans),
        messages=tuple(recorded["messages"]), status=TrajectoryStatus.COMPLETED,
        finish_reason="stop",
    )  # fmt: skip
    chat = ChatFormat(AutoTokenizer.from_pretrained(str(DEMO_MODEL)), tools=[CALCULATOR_TOOL])
    full: list[Any] = [*recorded["prompt_ids"], *recorded["response_ids"]]
    assert full == rebuilt(trajectory, chat)
