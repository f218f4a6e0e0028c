"""Chaos: ``kill -9`` of the shared ``toolrollout serve`` that ``generate --ray`` starts.

The driver supervises that server like the run's other services: restarted on the same
port with the same key (a log line for the death, one when it is back), stopped with the
run. The workers' engine client rides out the restart (its retry budget is in time), so
the run ends by itself with every sample once and none failed, and nothing of either
server process is left after it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.faults.test_chaos_services import _alive

from toolrollout.rollout import read_rows, read_shards

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

REPO = Path(__file__).resolve().parents[2]
RUN_SECONDS = 300
"""Upper bound on the run here (a loaded CI machine); quiet, it takes well under a minute."""


def _engine_record(runtime: Path) -> dict[str, object] | None:
    """The record of the engine server the driver started (the supervisor writes it)."""
    for path in (runtime / "toolrollout" / "services").glob("*.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if record.get("kind") == "engine server":
            return dict(record)
    return None


def test_kill_9_of_the_shared_server_mid_ray_run(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    runtime = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "120", "RAY_USAGE_STATS_ENABLED": "0"}
    env["XDG_RUNTIME_DIR"] = str(runtime)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (env.get("PYTHONPATH", ""), str(REPO / "src")) if p
    )
    out = tmp_path / "o.parquet"
    prompts, n = 4, 2
    argv = [sys.executable, "-m", "toolrollout", "generate", "--ray", "--ray-workers", "1"]
    argv += ["--tool-config", str(REPO / "tool_configs" / "calculator.yaml")]
    argv += ["--limit", str(prompts), "--n", str(n), "--concurrency", "2", "--flush-every", "1"]
    argv += ["--out", str(out)]
    started = time.monotonic()
    with (tmp_path / "stderr.log").open("wb") as err:
        proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=err, env=env)
    spill = out.with_name(out.name + ".parts") / "worker-000"
    first = second = None
    try:
        deadline = time.monotonic() + RUN_SECONDS
        # The kill lands once the worker has written its first rows: the rest need the server.
        while not list(spill.glob("part-*.parquet")):
            assert proc.poll() is None, (tmp_path / "stderr.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no row written in time"
            time.sleep(0.02)
        record = _engine_record(runtime)
        assert record is not None
        first, port = int(record["pid"]), int(record["port"])  # type: ignore[call-overload]
        before = {(r["prompt_index"], r["sample_index"]) for r in read_shards(spill).to_pylist()}
        os.kill(first, signal.SIGKILL)
        killed = time.monotonic()
        while (record := _engine_record(runtime)) is None or record["pid"] == first:
            assert proc.poll() is None, (tmp_path / "stderr.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the server was not restarted"
            time.sleep(0.05)
        restart = time.monotonic() - killed
        second = int(record["pid"])  # type: ignore[call-overload]
        proc.wait(max(deadline - time.monotonic(), 1))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    wall = time.monotonic() - started
    print(f"the server was back {restart:.1f} s after the kill; run {wall:.1f} s")  # noqa: T201
    stderr = (tmp_path / "stderr.log").read_text(errors="replace")
    assert proc.returncode == 0, stderr[-3000:]
    assert f"the engine server on port {port}: pid {first} died, exit status -9; restarting it" in (
        stderr
    )
    assert f"the engine server on port {port} is back (pid {second})" in stderr
    rows = read_rows(out)
    keys = [(r["prompt_index"], r["sample_index"]) for r in rows]
    assert keys == [(p, s) for p in range(prompts) for s in range(n)]  # each exactly once
    # Requests in flight at the kill were retried onto the restarted server; none failed.
    assert not [r for r in rows if r["failed"]], [r["error"] for r in rows if r["failed"]]
    # Rows were generated after the kill, by the new process.
    assert [k for k in keys if k not in before]
    # Neither server outlives the run.
    deadline = time.monotonic() + 10
    while (_alive(first) or _alive(second)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(first) and not _alive(second)
    assert _engine_record(runtime) is None
    assert wall < RUN_SECONDS
