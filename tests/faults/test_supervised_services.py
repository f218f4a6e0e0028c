"""The supervisor of a run's local services, on a real child process (Python's http.server).

Each test kills or fakes what a fault would: SIGKILL of the service (restarted, within the
restart budget, then declared down), SIGKILL of the run (the service goes with it), a stale
service of an earlier run on the port (replaced), and a process the run did not start on
the port (refused in one line).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest
from tests._processes import free_port

from toolrollout._exceptions import ToolUnavailable, UserError
from toolrollout._port_records import claim_port, record_path
from toolrollout._supervisor import (
    RestartPolicy,
    ServiceCommand,
    supervise,
    supervised,
    until_serving,
)
from toolrollout.tools import (
    RetryPolicy,
    ToolCallRequest,
    ToolExecutor,
    ToolLimits,
    load_tool_config,
    open_tools,
)
from toolrollout.tools.mcp import McpClientManager, list_mcp_tools
from toolrollout.tools.mcp._launch import LocalMcpHttpService
from toolrollout.tools.mcp._servers import HttpServer, parse_mcp_servers

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _own_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    yield


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def http_server(port: int) -> ServiceCommand:
    url = f"http://127.0.0.1:{port}/"

    async def ready(client: httpx.AsyncClient) -> bool:
        return (await client.get(url)).status_code == 200

    argv = (sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1")
    return ServiceCommand(kind="test", argv=argv, host="127.0.0.1", port=port, ready=ready)


async def _until(predicate: object, within: float = 20.0) -> None:
    with anyio.fail_after(within):
        while not predicate():  # type: ignore[operator]  # noqa: ASYNC110
            await anyio.sleep(0.02)


async def test_a_killed_service_is_restarted_with_a_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="toolrollout.services")
    port = free_port()
    async with supervise(http_server(port)) as service:
        first = service.pid
        assert json.loads(record_path(port).read_text())["pid"] == first
        os.kill(first, signal.SIGKILL)
        await _until(lambda: len(service.pids) == 2 and service.restart_seconds)
        assert not _alive(first) and _alive(service.pid)
        async with httpx.AsyncClient() as client:
            assert (await client.get(f"http://127.0.0.1:{port}/")).status_code == 200
        assert json.loads(record_path(port).read_text())["pid"] == service.pid
        assert service.restarts == 1 and not service.down
        print(f"restart latency: {service.restart_seconds[0]:.2f} s")  # noqa: T201
        assert service.restart_seconds[0] < 10
    assert not _alive(service.pid) and not record_path(port).exists()
    messages = [r.getMessage() for r in caplog.records]
    assert any(
        f"the test on port {port}: pid {first} died, exit status -9; restarting it (restart 1" in m
        for m in messages
    ), messages
    assert any("is back" in m for m in messages)


async def test_past_the_restart_budget_the_service_is_down(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="toolrollout.services")
    port = free_port()
    async with supervise(http_server(port), RestartPolicy(max_restarts=2, window=60)) as service:
        for round_ in range(3):
            await _until(lambda n=round_: len(service.restart_seconds) == n)
            os.kill(service.pid, signal.SIGKILL)
        await _until(lambda: service.down)
        await anyio.sleep(0.5)
        assert len(service.pids) == 3  # no fourth start
        with pytest.raises(httpx.ConnectError):
            async with httpx.AsyncClient() as client:
                await client.get(f"http://127.0.0.1:{port}/")
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "died 3 times within 60 s: declared down" in errors[0]


async def test_a_service_that_cannot_start_is_an_error_with_its_output() -> None:
    port = free_port()
    argv = (sys.executable, "-c", "import sys; print('no luck'); sys.exit(3)")
    command = ServiceCommand("test", argv, "127.0.0.1", port, http_server(port).ready)
    with pytest.raises(ToolUnavailable, match=r"the test on port \d+ exited at startup: no luck"):
        async with supervise(command):
            pytest.fail("it never started")


FAST_PROBE = RestartPolicy(probe_interval=0.2, probe_timeout=0.5, probe_misses=3)


async def test_a_hung_service_is_killed_and_restarted_with_a_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """SIGSTOP: alive, its port still accepts TCP connections, but nothing answers."""
    caplog.set_level(logging.WARNING, logger="toolrollout.services")
    port = free_port()
    async with supervise(http_server(port), FAST_PROBE) as service:
        first = service.pid
        await anyio.sleep(1.0)  # probes answered meanwhile: a serving service is left alone
        assert service.pids == [first] and service.hangs == 0
        os.kill(first, signal.SIGSTOP)
        stopped = time.monotonic()
        await _until(lambda: service.restart_seconds)
        detected = time.monotonic() - stopped
        assert service.hangs == 1 and service.restarts == 1 and service.serving
        assert not _alive(first)  # killed although stopped, its group with it
        async with httpx.AsyncClient() as client:
            assert (await client.get(f"http://127.0.0.1:{port}/")).status_code == 200
        print(f"hang found and restarted after {detected:.2f} s")  # noqa: T201
        # Three misses of at most 0.5 s with 0.2 s between: well under 10 s.
        assert detected < 10
    assert not _alive(service.pid)
    messages = [r.getMessage() for r in caplog.records]
    assert any(
        f"the test on port {port}: pid {first} stopped answering (3 liveness probes in a row "
        "got no answer within 0.5 s); killed it; restarting it (restart 1" in m
        for m in messages
    ), messages


async def test_calls_arriving_during_a_restart_wait_for_it() -> None:
    port = free_port()
    async with supervise(http_server(port)) as service:
        assert supervised(port) is service and await until_serving(port) is service
        first = service.pid
        os.kill(first, signal.SIGKILL)
        await _until(lambda: not service.serving)  # the outage is known (milliseconds)
        started = time.monotonic()
        assert await until_serving(port) is service and service.serving
        waited = time.monotonic() - started
        async with httpx.AsyncClient() as client:  # goes straight to the new process
            assert (await client.get(f"http://127.0.0.1:{port}/")).status_code == 200
        assert service.pid != first and service.calls_waited == 1
        print(f"a call waited {waited:.2f} s for the restart")  # noqa: T201
    assert supervised(port) is None and await until_serving(port) is None


async def test_a_call_after_a_death_not_yet_noticed_goes_to_the_restarted_process(
    tmp_path: Path,
) -> None:
    """The run's own retriever (the real one) dies and the call comes before the supervisor
    has noticed (no await in between): nothing was sent to the dead process, so the call
    waits for the restart instead of failing. No tool retries here."""
    pytest.importorskip("bm25s")
    port = free_port()
    text = (REPO / "tool_configs" / "search.yaml").read_text(encoding="utf-8")
    text = text.replace("8000", str(port)).replace("http_retries: 3", "http_retries: 0")
    (tmp_path / "search.yaml").write_text(text, encoding="utf-8")
    [tool] = load_tool_config(tmp_path / "search.yaml")
    call = ToolCallRequest("search", {"query_list": ["capital of France"]})
    async with open_tools([tool]):
        service = supervised(port)
        assert service is not None
        executor = ToolExecutor([tool])
        assert not (await executor.run_call(call)).is_error
        first = service.pid
        os.kill(first, signal.SIGKILL)
        while _alive(first):  # no await: the supervisor cannot notice before the call
            time.sleep(0.01)  # noqa: ASYNC251  (blocking on purpose)
        assert service.serving and service.generation == 1
        result = await executor.run_call(call)
        assert result.error is None and result.attempts == 1, result.text
        assert service.generation == 2 and service.serving and service.calls_waited == 1
        # until_replaced on its own: called before the death is noticed, it waits for it.
        second = service.pid
        os.kill(second, signal.SIGKILL)
        assert service.serving and await service.until_replaced(2)
        assert service.generation == 3 and service.pid != second


SLOW_SECOND_START = textwrap.dedent(
    """
    import os, sys, time, runpy
    flag = sys.argv.pop(1)
    if os.path.exists(flag):
        time.sleep(30)
    open(flag, "w").close()
    sys.argv = ["http.server", *sys.argv[1:]]
    runpy.run_module("http.server", run_name="__main__")
    """
)


async def test_the_wait_for_a_restart_is_bounded(tmp_path: Path) -> None:
    port = free_port()
    plain = http_server(port)
    argv = (sys.executable, "-c", SLOW_SECOND_START, str(tmp_path / "started"), *plain.argv[3:])
    command = ServiceCommand("test", argv, "127.0.0.1", port, plain.ready)
    async with supervise(command, RestartPolicy(call_wait=1.0)) as service:
        os.kill(service.pid, signal.SIGKILL)
        await _until(lambda: not service.serving)
        started = time.monotonic()
        assert await until_serving(port) is service
        waited = time.monotonic() - started
        assert not service.serving and 0.9 < waited < 5  # its restart takes 30 s
    assert not _alive(service.pid)  # the one still starting is stopped with the run


RUN = textwrap.dedent(
    """
    import anyio, sys
    from tests.faults.test_supervised_services import http_server
    from toolrollout._supervisor import supervise

    async def main():
        async with supervise(http_server(int(sys.argv[1]))) as service:
            print(service.pid, flush=True)
            await anyio.sleep_forever()

    anyio.run(main)
    """
)


def test_the_service_dies_with_its_run_even_on_sigkill(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path / "run")}
    run = subprocess.Popen(
        [sys.executable, "-c", RUN, str(port)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert run.stdout is not None
        pid = int(run.stdout.readline())
        assert _alive(pid)
        run.send_signal(signal.SIGKILL)
        run.wait(10)
        deadline = time.monotonic() + 5
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _alive(pid), "the service outlived its run"
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()


def _start_time(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def _orphan(port: int, owner: int, owner_start: int | None) -> subprocess.Popen[bytes]:
    """A service left by an earlier run: running, recorded, its owner as given."""
    command = http_server(port)
    orphan = subprocess.Popen(command.argv, start_new_session=True, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.05)
    path = record_path(port)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"kind": "test", "port": port, "pid": orphan.pid}
    record |= {"pid_start": _start_time(orphan.pid), "owner": owner, "owner_start": owner_start}
    path.write_text(json.dumps(record))
    return orphan


async def test_a_stale_service_of_an_earlier_run_is_replaced(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="toolrollout.services")
    port = free_port()
    orphan = _orphan(port, 2**22 + 1, 1)  # its run is gone (no such pid)
    try:
        assert await claim_port("test", "127.0.0.1", port) is False
        orphan.wait(5)  # killed, and the port is free
        async with supervise(http_server(port)) as service:
            assert service.pid != orphan.pid
    finally:
        if orphan.poll() is None:
            orphan.kill()
    assert any(
        f"port {port}: replacing a stale test (pid {orphan.pid}) left by an earlier run"
        in r.getMessage()
        for r in caplog.records
    )


async def test_a_service_of_another_live_run_is_refused_unless_its_settings_match() -> None:
    port = free_port()
    parent = os.getppid()
    orphan = _orphan(port, parent, _start_time(parent))  # its run is alive
    try:
        with pytest.raises(UserError) as caught:
            await claim_port("test", "127.0.0.1", port)
        assert str(caught.value) == (
            f"port {port} on 127.0.0.1 is in use by the test of another running toolrollout "
            f"process (pid {parent}) with other settings; give this run another port"
        )
        assert orphan.poll() is None  # left alone
        # Started with the same settings (the workers of one --ray run): shared.
        argv = list(http_server(port).argv)
        record = json.loads(record_path(port).read_text()) | {"argv": argv}
        record_path(port).write_text(json.dumps(record))
        assert await claim_port("test", "127.0.0.1", port, argv) is True
    finally:
        orphan.kill()
        orphan.wait()


async def test_a_foreign_process_on_the_port_is_a_one_line_error() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with pytest.raises(UserError) as caught:
            await claim_port("test", "127.0.0.1", port)
    assert str(caught.value) == (
        f"port {port} on 127.0.0.1 is in use by a process this run did not start; stop it or "
        "choose another port"
    )


def test_a_server_the_user_started_by_hand_is_used_with_a_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A ``toolrollout retriever serve`` a user started (no run record) is used, and the
    log says it is not supervised; for another kind of service the port stays refused.
    The listener stands in for the real CLI: what tells it apart is its command line
    (docs/search.md's page test runs the real one)."""
    port = free_port()
    listen = (
        "import socket,sys,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, "
        "socket.SO_REUSEADDR, 1); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); "
        "print('up', flush=True); time.sleep(60)"
    )
    argv = [sys.executable, "-c", listen, str(port), "toolrollout", "retriever", "serve"]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "up"
        with caplog.at_level(logging.WARNING, logger="toolrollout.services"):
            assert anyio.run(claim_port, "retriever", "127.0.0.1", port) is True
        assert f"using the retriever you started yourself (pid {process.pid}" in caplog.text
        with pytest.raises(UserError, match="in use by a process this run did not start"):
            anyio.run(claim_port, "sandbox", "127.0.0.1", port)
    finally:
        process.kill()
        process.wait()


EVERYTHING = REPO / ".ci/node/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
NODE = shutil.which("node")


@pytest.mark.skipif(NODE is None or not EVERYTHING.exists(), reason="needs server-everything")
async def test_a_launched_mcp_http_server_comes_back_and_its_session_reconnects() -> None:
    """The reference server (not ours), started by the run from its mcpServers entry."""
    port = free_port()
    entry: dict[str, object] = {"url": f"http://127.0.0.1:{port}/mcp", "command": NODE}
    entry |= {"args": [str(EVERYTHING), "streamableHttp"], "env": {"PORT": str(port)}}
    spec = parse_mcp_servers({"mcpServers": {"everything": entry}})["everything"]
    assert isinstance(spec, HttpServer) and spec.command == NODE
    limits = ToolLimits(timeout=20.0, retry=RetryPolicy(max_attempts=1))
    async with LocalMcpHttpService(spec).open() as service, McpClientManager([spec]) as manager:
        assert service is not None
        tools = {t.name: t for t in await list_mcp_tools(manager, limits=limits)}
        echo = ToolExecutor([tools["echo"]])
        call = ToolCallRequest("echo", {"message": "hi"})
        assert "hi" in (await echo.run_call(call)).text
        first = service.pid
        os.kill(first, signal.SIGKILL)
        await _until(lambda: not service.serving)  # the death is known; no restart yet
        results = [await echo.run_call(call) for _ in range(3)]
        # The first call waits for the restart; the session opened on the killed process is
        # replaced before any call is sent on it: none fails (no retries here).
        assert [r.error for r in results] == [None] * 3
        assert all("hi" in r.text for r in results)
        assert service.calls_waited == 1 and len(service.restart_seconds) == 1
        assert manager.statistics()["everything"].sessions_opened == 2
        assert not _alive(first) and service.pid != first
    assert not _alive(service.pid)
