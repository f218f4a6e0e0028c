"""``toolrollout generate`` on two real SGLang workers behind PyPI's real sglang-router,
with one worker killed (SIGKILL to its whole process group) in the middle of the run.

The router runs with its own retries off: the requests in flight on the dead worker come
back to the client as errors, and toolrollout's retries (through the router, which drops
the dead worker) must carry every trajectory to its end.

The worker is frozen with SIGSTOP as soon as it holds requests, so the run cannot end
before the kill lands and its requests are in flight when it does (as in
tests/faults/test_chaos_engines.py, which does the same to ``toolrollout serve``). What
must hold afterwards, from the output rows and the run's own counters: every sample has
exactly one row, no row came from nowhere, and a row that failed says why.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path

import httpx
import pytest

from tests._processes import free_port, stop, wait_http
from tests.real_engines.sglang._launch import LIMIT, SGLangServer
from toolrollout.rollout import read_rows

pytestmark = [pytest.mark.real_engine, pytest.mark.router, pytest.mark.timeout(LIMIT)]

PROMPTS, SAMPLES = 12, 2
RUN = ["--limit", str(PROMPTS), "--n", str(SAMPLES), "--seed", "5", "--max-turns", "3",
       "--max-new-tokens", "48", "--temperature", "1.0", "--concurrency", "8",
       "--flush-every", "2", "--out", "o.parquet"]  # fmt: skip
KEYS = [(p, s) for p in range(PROMPTS) for s in range(SAMPLES)]


@pytest.fixture(scope="module")
def routed(
    start_sglang: Callable[..., AbstractContextManager[SGLangServer]],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, list[SGLangServer]]]:
    """Two float32 workers, started side by side, and the router in front of them."""
    logs = tmp_path_factory.mktemp("router")
    with ExitStack() as stack:
        with ThreadPoolExecutor(2) as pool:
            starting = [pool.submit(stack.enter_context, start_sglang()) for _ in range(2)]
        workers = [f.result() for f in starting]
        port = free_port()
        router = subprocess.Popen(
            [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
             "--port", str(port), "--worker-urls", *(w.url for w in workers),
             "--policy", "round_robin", "--log-level", "warn",
             # the router would resend a failed request to the other worker itself; without
             # that, toolrollout's own retries are what carries the run through the kill
             "--disable-retries",
             # its metrics listener defaults to 0.0.0.0:29000; a free loopback port instead
             "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())],
            stdout=(logs / "router.log").open("wb"), stderr=subprocess.STDOUT,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
        stack.callback(stop, router)
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/health", 120, router)
        yield url, workers


def _in_flight(worker: SGLangServer) -> bool:
    """Whether the worker holds a request (running or queued), from SGLang's /v1/loads."""
    try:
        loads = httpx.get(f"{worker.url}/v1/loads", timeout=5).json()
    except (httpx.HTTPError, ValueError):
        return False
    return any(int(s.get("num_running_reqs", 0)) + int(s.get("num_waiting_reqs", 0)) > 0
               for s in loads.get("loads", []))  # fmt: skip


def _summary(stdout: str) -> dict[str, str]:
    """The rows of generate's summary table, metric -> value."""
    rows: dict[str, str] = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if len(cells) == 2 and cells[0]:
            rows[cells[0]] = cells[1]
    return rows


def test_a_worker_killed_mid_run_loses_and_duplicates_nothing(
    routed: tuple[str, list[SGLangServer]],
    tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:
    router, (doomed, _) = routed
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolrollout", "generate", "--engine-url", router, *RUN],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    killed_at: float | None = None
    try:
        deadline = time.monotonic() + 400
        while not _in_flight(doomed):
            assert proc.poll() is None, f"generate ended before the kill: {proc.communicate()}"
            assert time.monotonic() < deadline, "no request reached the doomed worker"
            time.sleep(0.05)
        pgid = _pgid_of(doomed)
        os.killpg(pgid, signal.SIGSTOP)  # what the router sends it now hangs
        time.sleep(1.0)  # the run goes on sending it turns
        assert proc.poll() is None, "generate ended while the worker was frozen"
        os.killpg(pgid, signal.SIGKILL)  # kill -9, for good
        killed_at = time.monotonic() - started
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    rows = read_rows(tmp_path / "o.parquet")
    # nothing lost, nothing duplicated
    assert sorted((r["prompt_index"], r["sample_index"]) for r in rows) == KEYS
    assert len({r["uid"] for r in rows}) == len(rows)
    # failures named: a failed row carries its cause and the error, and the counters agree
    failed = [r for r in rows if r["failed"]]
    assert all(r["finish_reason"] and r["error"] for r in failed), failed
    summary = _summary(out)
    assert summary["trajectories"] == str(len(KEYS))
    assert summary.get("status failed", "0") == str(len(failed))
    causes: dict[str, int] = {}
    for r in failed:
        causes[str(r["finish_reason"])] = causes.get(str(r["finish_reason"]), 0) + 1
    assert {k: int(summary[f"failed: {k}"]) for k in causes} == causes
    # the rows that finished are whole: engine logprobs on every model token
    for r in rows:
        if not r["failed"]:
            mask, logprobs = r["loss_mask"], r["rollout_logprobs"]
            assert all(lp < 0.0 or m == 0 for lp, m in zip(logprobs, mask, strict=True))
    # the router moved the rest to the surviving worker: none failed here
    assert failed == [], [r["error"] for r in failed]
    record_property("killed_after_s", round(killed_at or 0.0, 1))
    record_property("run_s", round(time.monotonic() - started, 1))


def _pgid_of(server: SGLangServer) -> int:
    """The process group of the ``sglang serve`` listening on the server's port (the
    launcher starts each server in a session of its own, scheduler and detokenizer
    included)."""
    port = server.url.rsplit(":", 1)[1]
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            b"serve" in argv
            and b"--port" in argv
            and argv[argv.index(b"--port") + 1] == port.encode()
        ):
            return os.getpgid(int(entry.name))
    raise AssertionError(f"no sglang serve process on port {port}")
