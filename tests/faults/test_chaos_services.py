"""Chaos: kill -9 a local service in the middle of a real ``toolrollout generate`` run.

The run starts the service itself (the sandbox with ``local_sandbox``, the retriever with
``local_corpus``, the calculator MCP server over streamable HTTP from an ``mcpServers``
entry with a ``command``), on the demo model. A SIGKILL of the service mid-run must leave:
every sample exactly once in the output; the rows whose tool call was in flight at the
kill FAILED with their cause (``tool_unavailable``, never scored); calls that arrive while
the service restarts wait for it (how many: the "is back" log line); the service back (a
log line) with later rows succeeding through it; no process of it left after the run; a
run that ends by itself in bounded time. A SIGKILL of ``generate`` itself must take its
services along.

The tools are configured without retries, so a call in flight at the kill fails at once
instead of riding it out (which a retry would do: that is tested elsewhere). Whether any
call is in flight at that instant is chance, so no test here requires a failed row.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests._processes import free_port

from toolrollout._port_records import record_path
from toolrollout.rollout import read_rows, read_shards

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
RUN_SECONDS = 300
"""Upper bound on one run here (a loaded CI machine); quiet, one takes 30-45 s."""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _in_groups(groups: set[int]) -> set[int]:
    """Live processes whose process group is one of ``groups`` (a service leads its own)."""
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) in groups and fields[0] not in ("Z", "X"):
            found.add(int(entry.name))
    return found


def _sandbox(tmp: Path, port: int) -> Path:
    text = (REPO / "tool_configs" / "sandbox.yaml").read_text(encoding="utf-8")
    text = text.replace("8080", str(port)).replace("http_retries: 3", "http_retries: 0")
    path = tmp / "sandbox.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _retriever(tmp: Path, port: int) -> Path:
    text = (REPO / "tool_configs" / "search.yaml").read_text(encoding="utf-8")
    text = text.replace("8000", str(port)).replace("http_retries: 3", "http_retries: 0")
    path = tmp / "search.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _mcp_http(tmp: Path, port: int) -> Path:
    """The calculator over streamable HTTP, started by the run (``command`` + ``url``)."""
    args = ["-m", "toolrollout.apps.mcp_servers.calculator", "--transport", "streamable-http"]
    entry = {
        "url": f"http://127.0.0.1:{port}/mcp",
        "command": "${PYTHON}",
        "args": [*args, "--port", str(port)],
    }
    (tmp / "servers.json").write_text(json.dumps({"mcpServers": {"calculator": entry}}))
    path = tmp / "mcp.yaml"
    path.write_text(
        "tools:\n"
        '  - class_name: "toolrollout.tools.mcp.McpTool"\n'
        "    config: {type: mcp, timeout: 10, retries: 0}\n"
        "    mcp: {mcp_servers_config_path: servers.json, tool_selected_list: [calculator]}\n",
        encoding="utf-8",
    )
    return path


@dataclass
class Chaos:
    rows: list[dict[str, object]]
    before: set[tuple[int, int]]
    """Samples already written when the service was killed."""
    stderr: str
    pids: list[int]
    """The service's processes: the one killed, then the restarted one(s)."""
    served: bool
    """Whether the restarted service was seen serving a connection before the run ended."""
    restart_seconds: float
    """From the kill to the new process being ready (its record written)."""
    wall_seconds: float
    returncode: int


def _generate(tmp: Path, config: Path, *args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "120"}
    env["XDG_RUNTIME_DIR"] = str(tmp / "run")  # the service records, as the test reads them
    paths = [p for p in (env.get("PYTHONPATH", ""), str(REPO / "src")) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)  # the checkout under test, not an install
    argv = [sys.executable, "-m", "toolrollout", "generate", "--tool-config", str(config)]
    argv += [*args, "--out", str(tmp / "o.parquet")]
    with (tmp / "stderr.log").open("wb") as err:
        return subprocess.Popen(argv, cwd=tmp, stdout=subprocess.DEVNULL, stderr=err, env=env)


def _record_pid(port: int) -> int | None:
    try:
        return int(json.loads(record_path(port).read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None


def _wait(what: str, predicate: object, proc: subprocess.Popen[bytes], tmp: Path) -> None:
    deadline = time.monotonic() + RUN_SECONDS
    while not predicate():  # type: ignore[operator]
        if proc.poll() is not None:
            log = (tmp / "stderr.log").read_text(errors="replace")[-3000:]
            pytest.fail(f"generate exited ({proc.returncode}) before {what}:\n{log}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} after {RUN_SECONDS} s")
        time.sleep(0.02)


def _connected(port: int) -> bool:
    """Whether a TCP connection to ``port`` on this machine is established (a call began)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with suppress(OSError), open(table, encoding="ascii") as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                if fields[3] == "01" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    return True
    return False


def _served(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds an established connection on its ``port``: it serves
    a call right now."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with suppress(OSError), open(table, encoding="ascii") as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                if fields[3] == "01" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(fields[9])
    with suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with suppress(OSError):
                if os.readlink(fd).removeprefix("socket:[").removesuffix("]") in inodes:
                    return True
    return False


def _bytes_read(pid: int) -> int:
    """What ``pid`` has read so far (``rchar``: files and sockets); 0 once it is gone."""
    with suppress(OSError, ValueError, IndexError):
        for line in Path(f"/proc/{pid}/io").read_text().splitlines():
            if line.startswith("rchar:"):
                return int(line.split()[1])
    return 0


_first_read: dict[int, int] = {}


def _calls_started(port: int) -> bool:
    """The run's own service is up and tool calls reach it: a connection to it, or bytes it
    read, and its record still the same 0.3 s later (the MCP listing at load time runs a
    short-lived server of its own)."""
    pid = _record_pid(port)
    if pid is None:
        return False
    first = _first_read.setdefault(pid, _bytes_read(pid))
    if not (_connected(port) or _bytes_read(pid) > first):
        return False
    time.sleep(0.3)
    return _record_pid(port) == pid and _alive(pid)


def _chaos(
    tmp: Path, config: Path, port: int, limit: int, n: int = 1, concurrency: int = 8
) -> Chaos:
    parts = tmp / "o.parquet.parts"
    started = time.monotonic()
    args = ["--limit", str(limit), "--n", str(n), "--concurrency", str(concurrency)]
    args += ["--flush-every", "2"]
    proc = _generate(tmp, config, *args)
    try:
        # Every row starts at once and makes its first call after its first turn: kill the
        # service once calls have begun, so later first calls meet the outage.
        _wait("tool calls", lambda: _calls_started(port), proc, tmp)
        first = _record_pid(port)
        assert first is not None and _alive(first)
        done = read_shards(parts).to_pylist() if parts.exists() else []
        before = {(r["prompt_index"], r["sample_index"]) for r in done}
        os.kill(first, signal.SIGKILL)
        killed = time.monotonic()
        _wait("restart", lambda: _record_pid(port) not in (None, first), proc, tmp)
        restart_seconds = time.monotonic() - killed
        second = _record_pid(port)
        assert second is not None
        # The restarted service answers calls, seen from outside: a connection it holds, or
        # bytes it read (a call to the retriever can be over between two looks).
        served, read_at_start = False, _bytes_read(second)
        while proc.poll() is None and time.monotonic() - started < RUN_SECONDS:
            served = served or _served(second, port) or _bytes_read(second) > read_at_start
            time.sleep(0.02)
        proc.wait(RUN_SECONDS)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    wall = time.monotonic() - started
    print(f"restart {restart_seconds:.2f} s, run {wall:.1f} s")  # noqa: T201
    return Chaos(
        rows=read_rows(tmp / "o.parquet"),
        before=before,
        stderr=(tmp / "stderr.log").read_text(errors="replace"),
        pids=[first, second],
        served=served,
        restart_seconds=restart_seconds,
        wall_seconds=wall,
        returncode=proc.returncode,
    )


def _check(chaos: Chaos, *, tool: str, port: int, limit: int, n: int = 1) -> None:
    assert chaos.returncode == 0, chaos.stderr[-3000:]
    keys = sorted((int(r["prompt_index"]), int(r["sample_index"])) for r in chaos.rows)  # type: ignore[call-overload]
    assert keys == [(p, s) for p in range(limit) for s in range(n)]  # each exactly once
    failed = [r for r in chaos.rows if r["status"] == "failed"]
    print(f"{len(failed)} row(s) failed on the kill")  # noqa: T201
    for row in failed:  # their cause, never a score
        assert row["finish_reason"] == "tool_unavailable" and row["reward"] is None
        assert f"tool '{tool}' unavailable" in str(row["error"])
    for row in chaos.rows:  # no row is scored on an infrastructure error
        if row["reward"] is not None:
            assert "unavailable" not in str(row["messages"]), row["messages"]
    # The service came back (one log line per restart) and later rows got through it.
    assert f"on port {port}: pid {chaos.pids[0]} died, exit status -9; restarting it" in (
        chaos.stderr
    )
    assert f"on port {port} is back (pid {chaos.pids[1]})" in chaos.stderr
    after = [
        r
        for r in chaos.rows
        if (r["prompt_index"], r["sample_index"]) not in chaos.before
        and r["status"] == "completed"
        and int(r["num_tool_calls"]) > int(r["tool_errors"])  # type: ignore[call-overload]
    ]
    assert after, "no row written after the kill used its tool"
    assert chaos.served, "no call reached the restarted service"
    # Nothing of the service is left once the run is over.
    deadline = time.monotonic() + 5
    while _in_groups(set(chaos.pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _in_groups(set(chaos.pids))
    assert not record_path(port).exists()
    assert chaos.wall_seconds < RUN_SECONDS


@pytest.fixture(autouse=True)
def _records_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))


def test_kill_9_of_the_sandbox_mid_run(tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    port = free_port()
    chaos = _chaos(tmp_path, _sandbox(tmp_path, port), port, limit=40)
    _check(chaos, tool="python", port=port, limit=40)


def test_kill_9_of_the_retriever_mid_run(tmp_path: Path) -> None:
    pytest.importorskip("bm25s")
    port = free_port()
    # The retriever restarts slowest (it indexes its corpus) and answers fastest: with two
    # requests at once and two samples a prompt, rows keep coming well past the restart, so
    # some calls wait for it and reach the new process (with fail-fast calls, the landing
    # CI of 2026-12 spent all 32 rows within a 2 s restart).
    chaos = _chaos(tmp_path, _retriever(tmp_path, port), port, limit=32, n=2, concurrency=2)
    _check(chaos, tool="search", port=port, limit=32, n=2)


def test_kill_9_of_an_mcp_http_server_mid_run(tmp_path: Path) -> None:
    port = free_port()
    # Two requests at once and two samples a prompt keep the run going past the restart
    # (~2 s), as for the retriever.
    chaos = _chaos(tmp_path, _mcp_http(tmp_path, port), port, limit=32, n=2, concurrency=2)
    _check(chaos, tool="calculator", port=port, limit=32, n=2)


def test_kill_9_of_generate_leaves_no_service_alive(tmp_path: Path) -> None:
    """All three services at once (the model's answers do not matter here)."""
    ports = [free_port() for _ in range(3)]
    configs = [
        _sandbox(tmp_path, ports[0]),
        _retriever(tmp_path, ports[1]),
        _mcp_http(tmp_path, ports[2]),
    ]
    tools = "tools:\n" + "".join(
        c.read_text(encoding="utf-8").split("tools:\n", 1)[1] for c in configs
    )
    config = tmp_path / "all.yaml"
    config.write_text(tools, encoding="utf-8")
    proc = _generate(tmp_path, config, "--limit", "8")
    try:
        _wait("services", lambda: all(_record_pid(p) for p in ports), proc, tmp_path)
        pids = [_record_pid(p) for p in ports]
        assert all(pid is not None and _alive(pid) for pid in pids)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        killed = time.monotonic()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    groups = {pid for pid in pids if pid is not None}
    while _in_groups(groups) and time.monotonic() - killed < 5:
        time.sleep(0.02)
    print(f"services gone {time.monotonic() - killed:.2f} s after the kill")  # noqa: T201
    assert not _in_groups(groups), "a service outlived generate's SIGKILL"
