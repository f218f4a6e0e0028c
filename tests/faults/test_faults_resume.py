"""Durable output and graceful shutdown of ``toolrollout generate``, as real processes.

A run is killed with SIGKILL in the middle (no chance to clean up), then ``--resume``
must finish it: every sample exactly once, the rows written before the kill kept as they
were. A second run is stopped with SIGTERM against a real ``toolrollout serve`` and an MCP
stdio tool server: it must abort its requests on the server, keep its finished rows, stop
its child process and exit non-zero with a summary.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tests._processes import free_port, stop, wait_http

from toolrollout.rollout import read_rows, read_shards

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "120"}
REPO = Path(__file__).resolve().parents[2]


def generate(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "toolrollout", "generate", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )


def finish(proc: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    """Wait for ``proc``; kill it rather than leave it behind when it overruns."""
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def wait_for_shards(parts: Path, count: int, proc: subprocess.Popen[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(list(parts.glob("part-*.parquet"))) >= count:
            return
        if proc.poll() is not None:
            pytest.fail(f"generate exited early ({proc.returncode}): {proc.communicate()[1]}")
        time.sleep(0.05)
    pytest.fail(f"no {count} shards in {parts} after {timeout} s")


def children_of(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found.update(int(x) for x in text)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_kill_9_mid_run_then_resume_completes_only_missing_samples(tmp_path: Path) -> None:
    args = ["--limit", "24", "--n", "2", "--seed", "5", "--flush-every", "4", "--out", "o.parquet"]
    parts = tmp_path / "o.parquet.parts"
    proc = generate(*args, cwd=tmp_path)
    try:
        wait_for_shards(parts, 2, proc, timeout=400)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert not (tmp_path / "o.parquet").exists()
    before = read_shards(parts).to_pylist()
    assert 8 <= len(before) < 48
    kept = {(r["prompt_index"], r["sample_index"]): r for r in before}
    assert len(kept) == len(before)

    # Starting over without --resume would silently redo finished work: refused (checked
    # in-process, since the refusal comes before any model is loaded).
    from typer.testing import CliRunner

    from toolrollout.apps.cli import app

    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path)
        fresh = CliRunner().invoke(app, ["generate", *args])
    assert fresh.exit_code == 2 and "pass --resume" in fresh.stderr

    resumed = generate(*args, "--resume", cwd=tmp_path)
    out, err = finish(resumed, 300)
    assert resumed.returncode == 0, err
    assert "rows kept from before" in out
    rows = read_rows(tmp_path / "o.parquet")
    keys = [(r["prompt_index"], r["sample_index"]) for r in rows]
    assert keys == [(p, s) for p in range(24) for s in range(2)]  # all, once, in order
    for row in rows:
        old = kept.get((row["prompt_index"], row["sample_index"]))
        if old is not None:  # written before the kill: the very same row, not a rerun
            assert row["uid"] == old["uid"]
            assert row["response_ids"] == old["response_ids"]
    # One run id across the kill: group ids are stable, the n samples stay one group.
    assert len({r["uid"].split("-")[0] for r in rows}) == 1
    assert all(len({r["group_id"] for r in rows if r["prompt_index"] == p}) == 1 for p in range(24))
    assert not parts.exists()


@pytest.fixture
def slow_server(tmp_path: Path) -> Iterator[str]:
    """The demo model behind ``toolrollout serve``, two sequences at a time (a queue forms)."""
    port = free_port()
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "toolrollout",
            "serve",
            "--port",
            str(port),
            "--threads",
            "1",
            "--max-batch-size",
            "2",
            "--log-level",
            "warning",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=ENV,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/health", 400, proc)
        yield url
    finally:
        stop(proc)


def test_sigterm_aborts_requests_keeps_rows_stops_children(
    tmp_path: Path, slow_server: str
) -> None:
    config = REPO / "tool_configs" / "mcp_stdio.yaml"
    args = [
        "--engine-url",
        slow_server,
        "--tool-config",
        str(config),
        "--limit",
        "30",
        "--n",
        "2",
        "--flush-every",
        "2",
        "--out",
        "o.parquet",
    ]
    parts = tmp_path / "o.parquet.parts"
    proc = generate(*args, cwd=tmp_path)
    try:
        wait_for_shards(parts, 1, proc, timeout=400)
        children = children_of(proc.pid)
        assert children, "the MCP stdio server should be a child of generate"
        load = httpx.get(f"{slow_server}/get_load").json()[0]
        assert load["num_reqs"] > 0  # requests are in flight on the server
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = finish(proc, 60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert time.monotonic() - sent < 30
    assert proc.returncode == 143, err
    assert "interrupted by SIGTERM" in err and "--resume" in err and "Traceback" not in err
    assert "trajectories" in err  # the summary table
    # Its requests were aborted on the server: nothing left running or queued there.
    deadline = time.monotonic() + 10
    while (
        httpx.get(f"{slow_server}/get_load").json()[0]["num_reqs"] and time.monotonic() < deadline
    ):
        time.sleep(0.1)
    assert httpx.get(f"{slow_server}/get_load").json()[0]["num_reqs"] == 0
    assert not any(alive(pid) for pid in children)
    rows = read_shards(parts).to_pylist()
    assert 0 < len(rows) < 60
    assert all(r["status"] != "aborted" for r in rows)  # cut-short samples are not rows
    assert f"{len(rows)} of 60 rows kept" in err  # --resume is tested above
