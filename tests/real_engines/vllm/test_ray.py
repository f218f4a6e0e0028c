"""``toolrollout generate --ray`` with a real vLLM server shared by the Ray workers.

The CLI runs as a user runs it: a subprocess that starts a local Ray cluster with two
workers, each of which finds the engine kind from the URL on its own. The merged file must
hold every sample once, on-policy (logprobs within 1e-4 of a float32 recompute at the run's
temperature) and labelled with vLLM's weight version. tests/conftest.py runs this module
with the other Ray modules, one cluster at a time.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.real_engines.vllm.test_entry_points import ENV, PARITY, largest_logprob_gap
from toolrollout.rollout import read_rows, read_run_metadata

pytestmark = [pytest.mark.real_engine, pytest.mark.slow, pytest.mark.timeout(900)]
"""A real server starts in 1-4 minutes on a loaded machine (setup counts toward the limit)."""


def test_ray_workers_share_a_vllm_server(vllm_server: Any, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "toolrollout", "generate", "--ray", "--ray-workers", "2",
         "--engine-url", vllm_server.url, "--limit", "4", "--n", "2", "--max-turns", "3",
         "--max-new-tokens", "48", "--temperature", "0.8", "--seed", "0",
         "--out", "rows.parquet"],
        cwd=tmp_path, capture_output=True, text=True, timeout=400,
        env={**ENV, "RAY_USAGE_STATS_ENABLED": "0"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = read_rows(tmp_path / "rows.parquet")
    assert sorted((r["prompt_index"], r["sample_index"]) for r in rows) == [
        (p, s) for p in range(4) for s in range(2)
    ]
    assert {r["status"] for r in rows} <= {"completed", "truncated"}, [r["error"] for r in rows]
    assert all(r["weight_version"] for r in rows)
    assert largest_logprob_gap(rows, 0.8) < PARITY
    # The shared server's facts are in the file, as in a run without --ray.
    engine = (read_run_metadata(tmp_path / "rows.parquet") or {})["engine"]
    assert engine["engine"] == "vllm" and engine["dtype"] == "float32", engine
