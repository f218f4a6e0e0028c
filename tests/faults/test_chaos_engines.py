"""Chaos against real ``toolrollout generate`` runs: engines killed with SIGKILL mid-run.

* Two ``--engine-url`` servers, one killed for good: its pinned trajectories move to the
  other (recorded as ``metrics.engine_moves``), the run completes, nothing fails.
* Behind PyPI's sglang-router: a worker killed for good, then the router itself killed and
  restarted only after 31 s; the client's retry budget in time rides through.

The demo run takes a few seconds on an idle machine, so a kill timed by polling can come
after the run has ended. A server is therefore frozen with SIGSTOP as soon as a request is
seen on it: what is sent to it then hangs (the kernel still accepts the connections), so
the run cannot end before the SIGKILL lands, and its requests are in flight when it does.
Behind the router both workers are frozen, so that the router too dies with requests in
flight; the surviving worker is thawed before the router comes back.

Every server is the real ``toolrollout serve`` with the demo model. Each run must end by
itself with every sample exactly once, no failed row and no process left behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from tests._processes import free_port, stop, wait_http

from toolrollout.rollout import read_rows

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "160"}
RUN = ["--limit", "30", "--n", "2", "--seed", "3", "--max-turns", "3", "--max-new-tokens",
       "48", "--concurrency", "8", "--flush-every", "2", "--out", "o.parquet"]  # fmt: skip
KEYS = [(p, s) for p in range(30) for s in range(2)]


def serve(port: int, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "toolrollout", "serve", "--port", str(port), "--threads", "1",
         "--max-batch-size", "4", "--log-level", "warning"],
        stdout=log.open("wb"), stderr=subprocess.STDOUT, env=ENV,
    )  # fmt: skip


Servers = list[tuple[str, subprocess.Popen[bytes]]]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    logs = tmp_path_factory.mktemp("servers")
    started = []
    try:
        for i in range(3):
            port = free_port()
            started.append((f"http://127.0.0.1:{port}", serve(port, logs / f"s{i}.log")))
        for url, proc in started:
            wait_http(f"{url}/health", 400, proc)
        yield started
    finally:
        for _, proc in started:
            stop(proc)


def generate(cwd: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "toolrollout", "generate", *args, *RUN],
        cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
    )  # fmt: skip


def wait_for(predicate: object, proc: subprocess.Popen[str], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(predicate) and predicate():
            return
        if proc.poll() is not None:
            pytest.fail(f"generate exited before {what}: {proc.communicate()[1]}")
        time.sleep(0.01)
    pytest.fail(f"no {what} after {timeout} s")


def in_flight(url: str) -> bool:
    try:
        return int(httpx.get(f"{url}/get_load", timeout=2).json()[0]["num_reqs"]) > 0
    except httpx.HTTPError:
        return False


def shards(cwd: Path) -> int:
    return len(list((cwd / "o.parquet.parts").glob("part-*.parquet")))


def finish(proc: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def alive_pid(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def check_rows(cwd: Path) -> list[dict[str, object]]:
    rows = read_rows(cwd / "o.parquet")
    assert [(r["prompt_index"], r["sample_index"]) for r in rows] == KEYS  # each once
    assert [r["error"] for r in rows if r["failed"]] == []
    assert not (cwd / "o.parquet.parts").exists()
    return rows


def test_one_of_two_servers_killed_for_good(
    servers: Servers, tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    (dead, dead_proc), (alive, _), _ = servers
    started = time.monotonic()
    proc = generate(tmp_path, "--engine-url", dead, "--engine-url", alive)
    # after a shard, trajectories are pinned to it (their first turn was served there)
    wait_for(lambda: shards(tmp_path) >= 1 and in_flight(dead), proc, 400, "requests on it")
    dead_proc.send_signal(signal.SIGSTOP)  # its trajectories now wait on it
    time.sleep(1.0)  # the pinned ones send it their next turns
    dead_proc.send_signal(signal.SIGKILL)  # for good: never restarted
    dead_proc.wait(timeout=30)
    out, err = finish(proc, 400)
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, err
    rows = check_rows(tmp_path)
    moves = [m for r in rows for m in r["metrics"].get("engine_moves", [])]  # type: ignore[attr-defined]
    assert moves, "a trajectory pinned to the killed server should have moved"
    assert all(m["from"] == dead and m["to"] == alive for m in moves)
    assert "moved to another server (failover)" in out
    assert elapsed < 400
    assert not alive_pid(proc.pid)  # the driver is gone, and it started no process
    record_property("failover", f"{len(moves)} moves, {elapsed:.1f} s")


def test_worker_killed_then_router_down_for_31_s(
    servers: Servers, tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    _, (worker, worker_proc), (doomed, doomed_proc) = servers
    port = free_port()
    router_url = f"http://127.0.0.1:{port}"

    def router(*workers: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
             "--port", str(port), "--worker-urls", *workers, "--policy", "round_robin",
             "--log-level", "warn",
             # its metrics listener defaults to 0.0.0.0:29000: a free loopback port instead,
             # so another router on the machine cannot make this one exit at start-up
             "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())],
            stdout=(tmp_path / "router.log").open("ab"), stderr=subprocess.STDOUT, env=ENV,
        )  # fmt: skip
        wait_http(f"{router_url}/health", 120, proc)
        return proc

    first = router(worker, doomed)
    second: subprocess.Popen[bytes] | None = None
    proc = generate(tmp_path, "--engine-url", router_url)
    try:
        wait_for(lambda: in_flight(doomed), proc, 400, "requests on the doomed worker")
        doomed_proc.send_signal(signal.SIGSTOP)  # what the router sent it now hangs
        worker_proc.send_signal(signal.SIGSTOP)  # and so does the rest: the run waits
        doomed_proc.send_signal(signal.SIGKILL)  # a worker behind the router, for good
        doomed_proc.wait(timeout=30)
        time.sleep(1.0)  # the router sees its requests to the dead worker fail
        first.send_signal(signal.SIGKILL)  # the router, with every request in flight
        first.wait(timeout=30)
        worker_proc.send_signal(signal.SIGCONT)
        down_at = time.monotonic()
        time.sleep(31.0)  # longer than any attempt-count budget used to last
        assert proc.poll() is None, "generate gave up while the router was down"
        second = router(worker)
        down_for = time.monotonic() - down_at
        _, err = finish(proc, 400)
    finally:
        worker_proc.send_signal(signal.SIGCONT)  # never leave the shared worker frozen
        for p in (first, second):
            if p is not None:
                stop(p)
    assert proc.returncode == 0, err
    check_rows(tmp_path)
    assert down_for > 31.0
    assert not alive_pid(proc.pid)
    record_property("router_down_s", round(down_for, 1))
