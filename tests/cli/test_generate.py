"""`toolrollout generate` as a user runs it: a subprocess, files on disk, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "120"}


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toolrollout", "generate", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )


def test_default_run_writes_parquet_readable_by_pandas_and_polars(tmp_path: Path) -> None:
    proc = run("--limit", "6", "--n", "2", "--seed", "3", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "trajectories.parquet"
    assert out.is_file()
    assert "mean reward" in proc.stdout and "status completed" in proc.stdout

    import pandas as pd
    import polars as pl

    df = pd.read_parquet(out)
    assert len(df) == 12
    assert set(df["status"]) <= {"completed", "truncated", "aborted", "failed"}
    assert (df.groupby("group_id").size() == 2).all()
    assert (df["num_tool_calls"] >= 1).mean() >= 0.8
    assert df["reward"].mean() >= 0.7
    row = df.iloc[0]
    assert len(row["response_ids"]) == len(row["loss_mask"]) == len(row["rollout_logprobs"])
    messages = json.loads(row["messages"])
    assert messages[-1]["role"] == "assistant"
    assert pl.read_parquet(out).height == 12


def test_jsonl_output_and_custom_dataset(tmp_path: Path) -> None:
    data = tmp_path / "q.jsonl"
    data.write_text(
        json.dumps({"messages": [{"role": "user", "content": "What is 12 * 12?"}], "answer": "144"})
        + "\n"
    )
    proc = run("--dataset", str(data), "--out", str(tmp_path / "o.jsonl"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    [line] = (tmp_path / "o.jsonl").read_text().splitlines()
    row = json.loads(line)
    assert row["prompt_index"] == 0 and row["status"] in {"completed", "truncated"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dataset", "missing.jsonl"], "dataset not found"),
        (["--tool-config", "missing.yaml"], "missing.yaml"),
        (["--tool-parser", "klingon"], "unknown --tool-parser"),
        (["--model", "no/such/dir"], "model folder not found"),
    ],
)
def test_user_mistakes_get_one_line_and_exit_2(
    tmp_path: Path, args: list[str], message: str
) -> None:
    proc = run(*args, cwd=tmp_path)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_bad_column_is_a_one_line_error(tmp_path: Path) -> None:
    data = tmp_path / "bad.jsonl"
    data.write_text(json.dumps({"question": "no messages column"}) + "\n")
    proc = run("--dataset", str(data), cwd=tmp_path)
    assert proc.returncode == 2
    assert "missing column 'messages'" in proc.stderr and "Traceback" not in proc.stderr


def test_library_example_runs(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "library_rollout.py"
    proc = subprocess.run(
        [sys.executable, str(example)], capture_output=True, text=True, env=ENV, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 8
    assert sum("reward=1.0" in line for line in lines) >= 6


def test_generate_with_the_mcp_stdio_config(tmp_path: Path) -> None:
    """The calculator served by an MCP server over stdio, from the shipped config alone."""
    config = Path(__file__).resolve().parents[2] / "tool_configs" / "mcp_stdio.yaml"
    proc = run("--limit", "3", "--tool-config", str(config), "--out", "mcp.jsonl", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in (tmp_path / "mcp.jsonl").read_text().splitlines()]
    assert len(rows) == 3
    called = [r for r in rows if r["num_tool_calls"] >= 1]
    assert called, rows
    for row in called:
        metrics = json.loads(row["metrics"])
        assert metrics["tool_stats"]["calculator"]["calls"] >= 1
        tool_messages = [m for m in json.loads(row["messages"]) if m["role"] == "tool"]
        assert tool_messages and not tool_messages[0]["content"].startswith("Error")
