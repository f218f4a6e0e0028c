"""Start the local sandbox as a child process for the length of an ``async with``."""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import AsyncIterator, Hashable, Iterable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, replace

import httpx

from toolrollout._exceptions import SandboxIsolationError, ToolUnavailable, UserError
from toolrollout._net import free_port
from toolrollout._port_records import claim_or_start
from toolrollout._security import keyless_environ
from toolrollout._supervisor import RestartPolicy, ServiceCommand, supervise
from toolrollout.tools import Tool
from toolrollout.tools._services import open_each, services_of

__all__ = [
    "LocalSandboxService",
    "free_port",
    "serve_local_sandboxes",
    "serve_sandbox_in_background",
]

logger = logging.getLogger(__name__)

_LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


def _sandbox_argv(
    host: str,
    port: int,
    max_concurrency: int | None = None,
    unsafe_no_isolation: bool = False,
    extra_args: Sequence[str] = (),
) -> list[str]:
    argv = [sys.executable, "-m", "toolrollout", "sandbox", "serve"]
    argv += ["--host", host, "--port", str(port), "--log-level", "warning"]
    if max_concurrency is not None:
        argv += ["--max-concurrency", str(max_concurrency)]
    if unsafe_no_isolation:
        argv.append("--unsafe-no-isolation")
    return argv + list(extra_args)


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
    restart: RestartPolicy | None = None,
) -> AsyncIterator[str]:
    """Run ``toolrollout sandbox serve`` in a child process, supervised; yield its
    ``/run_code`` URL once ``GET /v1/ping`` answers (``port=0``: a free port). Raises
    SandboxIsolationError when isolation is unavailable, ToolUnavailable for another failed
    start."""
    port = port or free_port(host)
    argv = _sandbox_argv(host, port, max_concurrency, unsafe_no_isolation, extra_args)
    url = f"http://{host}:{port}"

    async def ready(client: httpx.AsyncClient) -> bool:
        return (await client.get(f"{url}/v1/ping")).status_code == 200

    def startup_error(status: int | None, text: str) -> Exception:
        if status is None:
            return ToolUnavailable(
                f"the local sandbox was not up within {startup_timeout:g} s: " + text[-500:]
            )
        last = text.splitlines()[-1] if text else f"exit status {status}"
        if status == 2 and ("bubblewrap" in last or "isolat" in last):
            return SandboxIsolationError(last)
        return ToolUnavailable(f"the local sandbox exited at startup: {last}")

    command = ServiceCommand(
        kind="sandbox",
        argv=tuple(argv),
        host=host,
        port=port,
        ready=ready,
        env=env if env is not None else keyless_environ(),
        startup_timeout=startup_timeout,
        startup_error=startup_error,
    )
    async with supervise(command, restart) as service:
        logger.info("the local sandbox is up at %s (pid %d)", url, service.pid)
        yield f"{url}/run_code"


@dataclass(frozen=True, slots=True)
class LocalSandboxService:
    """The local sandbox on one port: the :class:`~toolrollout.tools.ToolService` of a
    sandbox tool with ``local_sandbox: true`` (sandbox tools on one port share it)."""

    port: int
    max_concurrency: int | None = None
    """``--max-concurrency`` of the server started (None: its default)."""
    startup_timeout: float = 60.0
    restart: RestartPolicy | None = None
    """How often it is restarted when it dies (None: :class:`RestartPolicy`'s defaults)."""

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
        """Start the sandbox, supervised; yield the URL started (None: this process serves
        one there already). A stale one of an earlier run is replaced."""
        start = functools.partial(
            serve_sandbox_in_background,
            self.port,
            max_concurrency=self.max_concurrency,
            startup_timeout=self.startup_timeout,
            restart=self.restart,
        )
        argv = _sandbox_argv("127.0.0.1", self.port, self.max_concurrency)
        async with claim_or_start("sandbox", "127.0.0.1", self.port, argv, start) as url:
            yield url


@asynccontextmanager
async def serve_local_sandboxes(
    tools: Iterable[Tool],
    *,
    max_concurrency: int | None = None,
    startup_timeout: float = 60.0,
) -> AsyncIterator[list[str]]:
    """Start the local sandbox of every tool with ``local_sandbox: true`` (as
    :func:`toolrollout.tools.open_tools` does), with this ``max_concurrency``; yield the
    ``/run_code`` URLs started, one per port."""
    services = (s for s in services_of(tools) if isinstance(s, LocalSandboxService))
    async with AsyncExitStack() as stack:
        opened = (
            replace(s, max_concurrency=max_concurrency, startup_timeout=startup_timeout).open()
            for s in services
        )
        yield await open_each(stack, opened)
