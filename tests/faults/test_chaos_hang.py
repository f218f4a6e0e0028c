"""Chaos: a local service that hangs (``kill -STOP``) in the middle of a real ``generate``.

A stopped process is alive and its port still accepts TCP connections (the kernel
completes them), but nothing answers: only the supervisor's liveness probe finds it. The
run must: kill it and restart it (a log line saying it stopped answering), fail the rows
whose call met the hang with their cause (never scored), send later rows to the new
process, leave nothing of either process behind, and end by itself in bounded time.

The helpers (running ``generate``, the tool configs without retries, the process checks)
are those of ``test_chaos_services.py``.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from tests._processes import free_port
from tests.faults.test_chaos_services import (
    RUN_SECONDS,
    _alive,
    _bytes_read,
    _calls_started,
    _generate,
    _in_groups,
    _record_pid,
    _sandbox,
    _wait,
)

from toolrollout._port_records import record_path
from toolrollout._supervisor import RestartPolicy
from toolrollout.rollout import read_rows, read_shards

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

DETECTION_SECONDS = 60
"""Upper bound on finding the hang and having the service back: the default probe (3 misses
of 5 s, 2 s apart) takes ~20 s, a restart of the sandbox ~2 s, on a loaded machine more."""


@pytest.fixture(autouse=True)
def _records_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))


def test_a_stopped_sandbox_is_found_hung_killed_and_restarted(tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    port, limit = free_port(), 40
    parts = tmp_path / "o.parquet.parts"
    started = time.monotonic()
    args = ["--limit", str(limit), "--concurrency", "8", "--flush-every", "2"]
    proc = _generate(tmp_path, _sandbox(tmp_path, port), *args)
    first: int | None = None
    try:
        _wait("tool calls", lambda: _calls_started(port), proc, tmp_path)
        first = _record_pid(port)
        assert first is not None and _alive(first)
        done = read_shards(parts).to_pylist() if parts.exists() else []
        before = {(r["prompt_index"], r["sample_index"]) for r in done}
        os.kill(first, signal.SIGSTOP)
        stopped = time.monotonic()
        while _record_pid(port) in (None, first):  # found hung, killed, started again
            assert proc.poll() is None, (tmp_path / "stderr.log").read_text()[-3000:]
            assert time.monotonic() - stopped < DETECTION_SECONDS, "the hang was not found"
            time.sleep(0.05)
        back = time.monotonic() - stopped
        second = _record_pid(port)
        assert second is not None
        served, read_at_start = False, _bytes_read(second)
        while proc.poll() is None and time.monotonic() - started < RUN_SECONDS:
            served = served or _bytes_read(second) > read_at_start
            time.sleep(0.02)
        proc.wait(RUN_SECONDS)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if first is not None and _alive(first):
            os.kill(first, signal.SIGCONT)  # never leave a stopped process behind
    wall = time.monotonic() - started
    print(f"hang found and the sandbox back after {back:.1f} s, run {wall:.1f} s")  # noqa: T201
    stderr = (tmp_path / "stderr.log").read_text(errors="replace")
    assert proc.returncode == 0, stderr[-3000:]
    rows = read_rows(tmp_path / "o.parquet")
    keys = sorted((int(r["prompt_index"]), int(r["sample_index"])) for r in rows)
    assert keys == [(p, 0) for p in range(limit)]  # each exactly once

    # Found by its probe, killed, restarted: one line with the cause, one when it is back.
    policy = RestartPolicy()
    assert (
        f"the sandbox on port {port}: pid {first} stopped answering ({policy.probe_misses} "
        f"liveness probes in a row got no answer within {policy.probe_timeout:g} s); killed "
        "it; restarting it (restart 1"
    ) in stderr
    assert f"the sandbox on port {port} is back (pid {second})" in stderr

    # The rows whose call met the hang (every row in flight makes a call within the ~20 s
    # it lasts) failed with their cause, never scored; nothing scored saw an outage.
    failed = [r for r in rows if r["status"] == "failed"]
    assert failed, "no row met the hang"
    for row in failed:
        assert row["finish_reason"] == "tool_unavailable" and row["reward"] is None
        assert "tool 'python' unavailable" in str(row["error"])
    for row in rows:
        if row["reward"] is not None:
            assert "unavailable" not in str(row["messages"]), row["messages"]

    # Later rows used the new process.
    after = [
        r
        for r in rows
        if (r["prompt_index"], r["sample_index"]) not in before
        and r["status"] == "completed"
        and int(r["num_tool_calls"]) > int(r["tool_errors"])
    ]
    assert after and served, "no call reached the restarted sandbox"

    # Nothing of either process is left once the run is over.
    deadline = time.monotonic() + 5
    while _in_groups({first, second}) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _in_groups({first, second})
    assert not record_path(port).exists()
    assert wall < RUN_SECONDS
