"""Helpers for the MCP tests: server specs, child processes, HTTP servers on free ports.

A plain module (not conftest.py), so test modules can import it by name.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio

from toolrollout.apps.mcp_servers.testkit import LOG_ENV, RATE_ENV
from toolrollout.tools.mcp._servers import StdioServer

REPO = Path(__file__).resolve().parents[3]


def kit_stdio(tmp_path: Path, *, name: str = "testkit", rate: int = 2) -> StdioServer:
    """The project's testkit server over stdio, logging to ``tmp_path / 'testkit.log'``."""
    return StdioServer(
        name=name,
        command=sys.executable,
        args=("-m", "toolrollout.apps.mcp_servers.testkit"),
        env={LOG_ENV: str(tmp_path / "testkit.log"), RATE_ENV: str(rate)},
    )


def read_log(tmp_path: Path) -> list[str]:
    path = tmp_path / "testkit.log"
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


async def wait_for(predicate: Callable[[], bool], within: float = 10.0) -> None:
    """Poll ``predicate`` (a file, a process: nothing to await) until it holds, at most
    ``within`` seconds."""
    with anyio.fail_after(within):
        while not predicate():  # noqa: ASYNC110
            await anyio.sleep(0.02)


def child_pids() -> set[int]:
    """Live (not zombie) processes whose parent is this test process."""
    me = str(os.getpid())
    pids: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces, so split after the last ')'.
        fields = stat.rsplit(")", 1)[1].split()
        if fields[1] == me and fields[0] != "Z":
            pids.add(int(entry.name))
    return pids


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class HttpServerProcess:
    """An example MCP server run as a subprocess on an HTTP transport."""

    def __init__(self, module: str, transport: str, port: int, env: dict[str, str]) -> None:
        self.module = module
        self.transport = transport
        self.port = port
        self.env = env
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                f"toolrollout.apps.mcp_servers.{self.module}",
                "--transport",
                self.transport,
                "--port",
                str(self.port),
            ],
            env={**os.environ, **self.env},
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.module} server exited with {self.process.returncode}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"{self.module} server did not listen on {self.port} in {timeout}s")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@contextmanager
def http_server(
    module: str, transport: str = "streamable-http", *, port: int | None = None, **env: str
) -> Iterator[HttpServerProcess]:
    server = HttpServerProcess(module, transport, port or free_port(), env)
    server.start()
    try:
        yield server
    finally:
        server.kill()
