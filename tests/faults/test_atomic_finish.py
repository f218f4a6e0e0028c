"""A SIGKILL at every step of finishing a run leaves a state ``--resume`` completes.

``toolrollout generate`` finishes in ordered, durable steps (``FINISH_STEPS``: merge under a
temporary name, rename, ``finished`` mark in ``run.json``, shards deleted, ``run.json``
deleted, folder removed). The process is killed at each step through their ``on_step``
callback (``tests/_kill_at.py``: it SIGKILLs itself there, no handler, no clean-up), then
``--resume`` must produce the very rows of the uninterrupted run, each sample once, and
a fresh run must give a one-line message instead of being stuck.

The rows come from a real ``generate`` against a real ``toolrollout serve`` (the demo
model); the kill at "rows-written" is that run's own driver killed after its last shard.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests._kill_at import killed_code, killed_command
from tests._processes import free_port, stop, wait_http
from typer.testing import CliRunner

from toolrollout.apps.cli import app
from toolrollout.rollout import read_rows, read_shards
from toolrollout.rollout._shards import FINISH_STEPS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "120"}
KEYS = [(p, s) for p in range(3) for s in range(2)]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = (tmp_path_factory.mktemp("serve") / "serve.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolrollout", "serve", "--port", str(port), "--threads", "1",
         "--log-level", "warning"],
        stdout=log, stderr=subprocess.STDOUT, env=ENV,
    )  # fmt: skip
    try:
        wait_http(f"http://127.0.0.1:{port}/health", 400, proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)


def args(url: str) -> list[str]:
    return ["--engine-url", url, "--limit", "3", "--n", "2", "--seed", "5", "--max-turns", "2",
            "--max-new-tokens", "24", "--flush-every", "2", "--out", "o.parquet"]  # fmt: skip


def killed_generate(cwd: Path, step: str, *extra: str) -> None:
    """A real ``generate`` driver that SIGKILLs itself at ``step``."""
    proc = subprocess.run(
        killed_command(step, "generate", *extra),
        cwd=cwd, env=ENV, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr


def killed_finish(cwd: Path, step: str) -> None:
    """The finishing code alone, SIGKILLed at ``step`` (the same function generate calls)."""
    code = "rollout.finish_shards('o.parquet.parts', 'o.parquet')"
    proc = subprocess.run(
        killed_code(step, code), cwd=cwd, env=ENV, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr


def invoke(cwd: Path, argv: list[str]) -> Any:
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(cwd)
        return CliRunner().invoke(app, ["generate", *argv])


@pytest.fixture(scope="module")
def base(server: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Any]]:
    """A real run killed after every row is on disk: its shard folder and its rows."""
    cwd = tmp_path_factory.mktemp("base")
    killed_generate(cwd, "rows-written", *args(server))
    assert not (cwd / "o.parquet").exists()
    rows = sorted(read_shards(cwd / "o.parquet.parts").to_pylist(),
                  key=lambda r: (r["prompt_index"], r["sample_index"]))  # fmt: skip
    assert [(r["prompt_index"], r["sample_index"]) for r in rows] == KEYS
    return cwd, rows


@pytest.mark.parametrize("step", FINISH_STEPS)
def test_kill_at_each_finishing_step_then_resume(
    step: str, server: str, base: tuple[Path, list[Any]], tmp_path: Path
) -> None:
    source, reference = base
    parts = tmp_path / "o.parquet.parts"
    shutil.copytree(source / "o.parquet.parts", parts)
    if step == "shard-deleted":  # the case, by a real generate driver
        killed_generate(tmp_path, step, *args(server), "--resume")
    elif step != "rows-written":  # "rows-written": the base run was killed there already
        killed_finish(tmp_path, step)
    marked = FINISH_STEPS.index(step) >= FINISH_STEPS.index("marked")

    # A fresh run: refused with the way out before the mark; after it, the leftover is
    # cleaned up with a one-line note (checked on the resume below for the other steps).
    if not marked:
        fresh = invoke(tmp_path, args(server))
        assert fresh.exit_code == 2 and "pass --resume" in fresh.stderr

    resumed = invoke(tmp_path, [*args(server), "--resume"])
    assert resumed.exit_code == 0, resumed.output + resumed.stderr
    rows = read_rows(tmp_path / "o.parquet")
    assert [(r["prompt_index"], r["sample_index"]) for r in rows] == KEYS  # each once
    expected = read_rows_like(reference)
    assert [r["uid"] for r in rows] == [r["uid"] for r in expected]  # nothing rerun
    assert rows == expected  # row for row: same tokens, same everything
    if marked:
        assert "nothing to resume: the run had finished into o.parquet" in resumed.stdout
    else:
        assert "rows kept from before" in resumed.stdout
    assert not parts.exists()
    assert not list(tmp_path.glob(".o.parquet*"))  # no temporary file left


def read_rows_like(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Shard rows decoded as read_rows decodes a merged file."""
    import json

    out = []
    for row in rows:
        row = dict(row)
        row["messages"] = json.loads(row["messages"])
        row["metrics"] = json.loads(row["metrics"])
        if isinstance(row.get("tool_final_rewards"), list):
            row["tool_final_rewards"] = dict(row["tool_final_rewards"])
        out.append(row)
    return out


def test_fresh_run_after_a_kill_in_the_clean_up_says_so_and_runs(
    server: str, base: tuple[Path, list[Any]], tmp_path: Path
) -> None:
    source, reference = base
    shutil.copytree(source / "o.parquet.parts", tmp_path / "o.parquet.parts")
    killed_finish(tmp_path, "shard-deleted")
    fresh = invoke(tmp_path, args(server))
    assert fresh.exit_code == 0, fresh.stderr
    assert "note: removed o.parquet.parts, left by a finished run of o.parquet (6 rows)" in (
        fresh.stderr.replace("\n", " ")
    )
    rows = read_rows(tmp_path / "o.parquet")
    assert [(r["prompt_index"], r["sample_index"]) for r in rows] == KEYS
    assert {r["uid"] for r in rows}.isdisjoint({r["uid"] for r in reference})  # a new run
    assert not (tmp_path / "o.parquet.parts").exists()
