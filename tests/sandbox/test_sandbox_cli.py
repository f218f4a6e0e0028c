"""``toolrollout sandbox serve`` refusing to run without bubblewrap, the background helper,
the unisolated mode, and the package's public surface."""

from __future__ import annotations

import importlib
import inspect
import os
import socket
import time

import anyio
import httpx
import pytest

from toolrollout import UserError
from toolrollout.exceptions import SandboxIsolationError
from toolrollout.sandbox import (
    RunCodeRequest,
    sandbox_tool,
    serve_local_sandboxes,
    serve_sandbox_in_background,
)
from toolrollout.sandbox._protocol import CommandRunStatus, RunStatus
from toolrollout.sandbox._runner import SandboxRunner, SandboxServerConfig
from toolrollout.tools import ToolContext

NO_BWRAP_ENV = {**os.environ, "PATH": "/nonexistent"}
"""An environment where ``bwrap`` cannot be found (the interpreter is started by path)."""


def test_serve_refuses_without_bwrap(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from toolrollout.apps.cli import app

    monkeypatch.setenv("PATH", "/nonexistent")
    result = CliRunner().invoke(app, ["sandbox", "serve", "--port", "1"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: bubblewrap (bwrap) was not found on PATH")
    assert "--unsafe-no-isolation" in lines[0]


def test_runner_refuses_a_missing_bwrap() -> None:
    with pytest.raises(SandboxIsolationError, match="not found at /nonexistent/bwrap"):
        SandboxRunner(SandboxServerConfig(bwrap="/nonexistent/bwrap"))
    assert issubclass(SandboxIsolationError, UserError)


def test_bad_server_settings() -> None:
    with pytest.raises(UserError, match="max_concurrency"):
        SandboxServerConfig(max_concurrency=0)
    with pytest.raises(UserError, match="max_run_timeout"):
        SandboxServerConfig(max_run_timeout=float("inf"))


async def test_background_helper_refuses_then_runs_unisolated_when_told() -> None:
    with pytest.raises(SandboxIsolationError, match="bubblewrap"):
        async with serve_sandbox_in_background(env=NO_BWRAP_ENV):
            pass
    async with serve_sandbox_in_background(
        unsafe_no_isolation=True, max_concurrency=1, env=NO_BWRAP_ENV
    ) as url:
        async with httpx.AsyncClient() as client:
            info = (await client.get(url.replace("/run_code", "/server_info"))).json()
        assert info["isolation"] == "none"
        result = await sandbox_tool(url).call({"code": "print(1 + 1)"}, ToolContext())
        assert result.text == "2"


async def test_serve_local_sandboxes_refuses_a_server_it_did_not_start() -> None:
    # A run never silently talks to a server it did not start (issue 23): the one-line
    # error names the port. (It used to be used as it was, old settings and all.)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        tool = sandbox_tool(f"http://127.0.0.1:{port}/run_code", local_sandbox=True)
        with pytest.raises(UserError) as caught:
            async with serve_local_sandboxes([tool]):
                pytest.fail("nothing may start")
    message = str(caught.value)
    assert message == (
        f"port {port} on 127.0.0.1 is in use by a process this run did not start; stop it "
        "or choose another port"
    )


async def test_serve_local_sandboxes_needs_a_local_url() -> None:
    tool = sandbox_tool("http://sandbox.example:8080/run_code", local_sandbox=True)
    with pytest.raises(UserError, match="local_sandbox needs a local"):
        async with serve_local_sandboxes([tool]):
            pass
    async with serve_local_sandboxes([sandbox_tool()]) as started:  # not asked for
        assert started == []


async def test_unisolated_runner_still_times_out_and_kills_the_group() -> None:
    runner = SandboxRunner(SandboxServerConfig(isolation="none", max_output_bytes=100))
    assert runner.isolation == "none"
    started = time.monotonic()
    response = await runner.run(
        RunCodeRequest(
            code="import subprocess\nsubprocess.Popen(['sleep', '30'])\n"
            "print('x' * 500, flush=True)\n"
            "while True: pass",
            language="python",
            run_timeout=1,
        )
    )
    assert time.monotonic() - started < 5
    assert response.status == RunStatus.Failed
    assert response.run_result is not None
    assert response.run_result.status == CommandRunStatus.TimeLimitExceeded
    assert "[truncated: 401 more bytes not shown]" in (response.run_result.stdout or "")
    with anyio.fail_after(5):
        while runner.running:  # noqa: ASYNC110 (a counter, not an event)
            await anyio.sleep(0.01)


def test_public_surface_is_sorted_and_complete() -> None:
    module = importlib.import_module("toolrollout.sandbox")
    exported = list(module.__all__)

    def key(name: str) -> tuple[int, str]:
        if name.isupper():
            return (0, name)
        return (1, name) if name[0].isupper() else (2, name)

    assert exported == sorted(exported, key=key)
    for name in exported:
        assert hasattr(module, name)
    for name, value in vars(module).items():
        if name.startswith("_") or inspect.ismodule(value):
            continue
        if inspect.isclass(value) or inspect.isfunction(value):
            assert name in exported, name


def test_seccomp_filter_programs() -> None:
    from toolrollout.sandbox._seccomp import userns_filter

    for machine in ("x86_64", "aarch64"):
        program = userns_filter(machine)
        assert program is not None and len(program) % 8 == 0
    assert userns_filter("riscv64") is None
