"""Start the local sandbox as a child process for the length of an ``async with``."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Hashable, Iterable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, replace

import anyio
import httpx

from toolrollout._exceptions import SandboxIsolationError, ToolUnavailable, UserError
from toolrollout._net import is_listening, stop_process
from toolrollout._security import keyless_environ
from toolrollout.tools import Tool

__all__ = [
    "LocalSandboxService",
    "free_port",
    "serve_local_sandboxes",
    "serve_sandbox_in_background",
]

logger = logging.getLogger(__name__)

_LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


@asynccontextmanager
async def serve_sandbox_in_background(
    port: int = 0,
    *,
    host: str = "127.0.0.1",
    max_concurrency: int | None = None,
    unsafe_no_isolation: bool = False,
    extra_args: Sequence[str] = (),
    startup_timeout: float = 60.0,
    env: dict[str, str] | None = None,
) -> AsyncIterator[str]:
    """Run ``toolrollout sandbox serve`` in a child process; yield its ``/run_code`` URL.

    ``port=0`` picks a free port. Waits until ``GET /v1/ping`` answers; on leaving, the
    server is terminated (then killed after 5 s), which also kills its running programs.

    Raises:
        SandboxIsolationError: the server refused to start because isolation is
            unavailable (its one-line message is included).
        ToolUnavailable: it exited for another reason or was not up within
            ``startup_timeout`` seconds.
    """
    port = port or free_port(host)
    argv = [sys.executable, "-m", "toolrollout", "sandbox", "serve"]
    argv += ["--host", host, "--port", str(port), "--log-level", "warning"]
    if max_concurrency is not None:
        argv += ["--max-concurrency", str(max_concurrency)]
    if unsafe_no_isolation:
        argv.append("--unsafe-no-isolation")
    argv += list(extra_args)
    url = f"http://{host}:{port}"
    with tempfile.TemporaryFile() as log:
        process = await anyio.open_process(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=env if env is not None else keyless_environ(),
        )

        def output() -> str:
            log.seek(0)
            return log.read().decode("utf-8", errors="replace").strip()

        try:
            ready = False
            async with httpx.AsyncClient(timeout=2.0) as client:
                with anyio.move_on_after(startup_timeout):
                    while process.returncode is None and not ready:
                        try:
                            ready = (await client.get(f"{url}/v1/ping")).status_code == 200
                        except httpx.TransportError:
                            pass
                        if not ready:
                            await anyio.sleep(0.1)
            if not ready:
                if process.returncode is None:
                    raise ToolUnavailable(
                        f"the local sandbox was not up within {startup_timeout:g} s: "
                        + output()[-500:]
                    )
                text = output()
                last = text.splitlines()[-1] if text else f"exit status {process.returncode}"
                if process.returncode == 2 and ("bubblewrap" in last or "isolat" in last):
                    raise SandboxIsolationError(last)
                raise ToolUnavailable(f"the local sandbox exited at startup: {last}")
            yield f"{url}/run_code"
        finally:
            await stop_process(process)


@dataclass(frozen=True, slots=True)
class LocalSandboxService:
    """The local sandbox on one port: the :class:`~toolrollout.tools.ToolService` of a
    sandbox tool with ``local_sandbox: true`` (sandbox tools on one port share it)."""

    port: int
    max_concurrency: int | None = None
    """``--max-concurrency`` of the server started (None: its default)."""
    startup_timeout: float = 60.0

    @classmethod
    def for_url(cls, url: str, *, tool: str) -> LocalSandboxService:
        """The service for a tool's ``/run_code`` URL, which must be local."""
        parsed = httpx.URL(url)
        if parsed.host not in _LOCAL_HOSTS:
            raise UserError(
                f"tool {tool!r}: local_sandbox needs a local sandbox_fusion_url "
                f"(127.0.0.1 or localhost), got {url}"
            )
        return cls(parsed.port or 80)

    @property
    def key(self) -> Hashable:
        return ("toolrollout.sandbox", self.port)

    @asynccontextmanager
    async def open(self) -> AsyncIterator[str | None]:
        """Start the sandbox unless something listens on the port; yield the URL started."""
        if await is_listening("127.0.0.1", self.port):
            logger.info("a server already listens on port %d; using it as the sandbox", self.port)
            yield None
            return
        async with serve_sandbox_in_background(
            self.port, max_concurrency=self.max_concurrency, startup_timeout=self.startup_timeout
        ) as url:
            yield url


@asynccontextmanager
async def serve_local_sandboxes(
    tools: Iterable[Tool],
    *,
    max_concurrency: int | None = None,
    startup_timeout: float = 60.0,
) -> AsyncIterator[list[str]]:
    """Start the local sandbox for every :class:`SandboxTool` that asks for it.

    :func:`toolrollout.tools.open_tools` does this too, with the other tools' services;
    this one takes the server's ``max_concurrency`` and yields what it started.

    A tool asks with ``local_sandbox: true`` in its config; its ``sandbox_fusion_url`` must
    then be local (127.0.0.1 / localhost). Where something already listens on that port it
    is used as it is. Yields the ``/run_code`` URLs of the servers started (one per port),
    and stops them on exit. Raises :class:`~toolrollout.exceptions.SandboxIsolationError` when
    bubblewrap is unavailable.
    """
    services: dict[int, LocalSandboxService] = {}
    for tool in tools:
        for service in tool.services():
            if isinstance(service, LocalSandboxService):
                services.setdefault(
                    service.port,
                    replace(
                        service, max_concurrency=max_concurrency, startup_timeout=startup_timeout
                    ),
                )
    async with AsyncExitStack() as stack:
        started: list[str] = []
        for service in services.values():
            url = await stack.enter_async_context(service.open())
            if url is not None:
                started.append(url)
        yield started
