"""Starting toolrollout's BM25 retriever as a child process, for as long as a block runs."""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import AsyncIterator, Hashable, Iterable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, replace
from os import PathLike
from pathlib import Path

import httpx

from toolrollout._exceptions import ToolUnavailable, UserError
from toolrollout._net import free_port
from toolrollout._port_records import claim_or_start
from toolrollout._security import keyless_environ
from toolrollout._supervisor import RestartPolicy, ServiceCommand, supervise
from toolrollout.tools import Tool
from toolrollout.tools._services import open_each, services_of

from .demo_corpus import DEMO_CORPUS_PATH

__all__ = [
    "LocalRetriever",
    "LocalRetrieverService",
    "free_port",
    "resolve_corpus",
    "serve_local_retrievers",
    "serve_retriever_in_background",
]

logger = logging.getLogger(__name__)

_LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "0.0.0.0", "::"})


@dataclass(frozen=True, slots=True)
class LocalRetriever:
    """A retriever started by :func:`serve_retriever_in_background`."""

    host: str
    """The interface it binds."""
    port: int
    pid: int
    corpus: Path

    @property
    def url(self) -> str:
        """Base URL to connect to (``http://127.0.0.1:PORT``)."""
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    @property
    def retrieve_url(self) -> str:
        """The ``/retrieve`` endpoint, as ``retrieval_service_url`` wants it."""
        return self.url + "/retrieve"


def resolve_corpus(corpus: str | PathLike[str] | None) -> Path:
    """``None`` or ``"demo"``: the bundled demo corpus; otherwise the path, which must exist."""
    if corpus is None or str(corpus) == "demo":
        return DEMO_CORPUS_PATH
    path = Path(corpus)
    if not path.is_file():
        raise UserError(f"corpus file not found: {path}")
    return path


def _retriever_argv(
    path: Path,
    host: str,
    port: int,
    topk: int = 3,
    log_level: str = "warning",
    stemming: bool = True,
) -> list[str]:
    return [
        sys.executable, "-m", "toolrollout", "retriever", "serve",
        "--corpus", str(path), "--host", host, "--port", str(port), "--topk", str(topk),
        "--log-level", log_level, "--stem" if stemming else "--no-stem",
    ]  # fmt: skip


@asynccontextmanager
async def serve_retriever_in_background(
    corpus: str | PathLike[str] | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    topk: int = 3,
    stemming: bool = True,
    startup_timeout: float = 60.0,
    log_level: str = "warning",
    restart: RestartPolicy | None = None,
) -> AsyncIterator[LocalRetriever]:
    """Run ``toolrollout retriever serve`` in a child process, supervised, while the block
    runs, once ``GET /health`` answers (``corpus`` None: the demo corpus; ``port`` 0: a free
    one). A failed start raises ToolUnavailable with the end of its output."""
    path = resolve_corpus(corpus)
    if port == 0:
        port = free_port(host)
    command = _retriever_argv(path, host, port, topk, log_level, stemming)
    env = {**keyless_environ(), "PYTHONUNBUFFERED": "1"}
    handle = LocalRetriever(host=host, port=port, pid=0, corpus=path)
    health = handle.url + "/health"

    async def ready(client: httpx.AsyncClient) -> bool:
        return (await client.get(health)).status_code == 200

    def startup_error(status: int | None, text: str) -> Exception:
        tail = text if len(text) <= 2000 else "..." + text[-2000:]
        if status is None:
            return ToolUnavailable(
                f"the retriever at {handle.url} was not ready after {startup_timeout:g}s:\n{tail}"
            )
        return ToolUnavailable(
            f"the retriever exited with code {status} before it was ready:\n{tail}"
        )

    service = ServiceCommand(
        kind="retriever",
        argv=tuple(command),
        host={"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host),
        port=port,
        ready=ready,
        env=env,
        startup_timeout=startup_timeout,
        startup_error=startup_error,
    )
    async with supervise(service, restart) as running:
        handle = replace(handle, pid=running.pid)
        logger.info("retriever for %s is up at %s (pid %d)", path, handle.url, running.pid)
        yield handle


@dataclass(frozen=True, slots=True)
class LocalRetrieverService:
    """toolrollout's BM25 retriever on one host and port: the
    :class:`~toolrollout.tools.ToolService` of a search tool with ``local_corpus``."""

    host: str
    port: int
    corpus: Path
    """The corpus served (resolved), so that two tools asking for one port agree."""
    startup_timeout: float = 60.0
    restart: RestartPolicy | None = None
    """How often it is restarted when it dies (None: :class:`RestartPolicy`'s defaults)."""

    @classmethod
    def for_url(cls, url: str, corpus: str | PathLike[str], *, tool: str) -> LocalRetrieverService:
        """The service for a tool's ``retrieval_service_url``, which must be local."""
        parsed = httpx.URL(url)
        if parsed.host not in _LOCAL_HOSTS:
            raise UserError(
                f"tool {tool!r}: local_corpus needs a local retrieval_service_url "
                f"(127.0.0.1 or localhost), got {url}"
            )
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        return cls(parsed.host, port, resolve_corpus(corpus).resolve())

    @property
    def key(self) -> Hashable:
        return ("toolrollout.search", self.host, self.port)

    @asynccontextmanager
    async def open(self) -> AsyncIterator[LocalRetriever | None]:
        """Start the retriever, supervised; yield it (None: this process serves one there
        already). A stale one of an earlier run is replaced."""
        connect_host = {"localhost": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(
            self.host, self.host
        )
        bind = "127.0.0.1" if self.host == "localhost" else self.host
        start = functools.partial(
            serve_retriever_in_background,
            self.corpus,
            host=bind,
            port=self.port,
            startup_timeout=self.startup_timeout,
            restart=self.restart,
        )
        argv = _retriever_argv(self.corpus, bind, self.port)
        async with claim_or_start("retriever", connect_host, self.port, argv, start) as opened:
            yield opened


@asynccontextmanager
async def serve_local_retrievers(
    tools: Iterable[Tool], *, startup_timeout: float = 60.0
) -> AsyncIterator[list[LocalRetriever]]:
    """Start a retriever for each search tool with ``local_corpus`` (as
    :func:`toolrollout.tools.open_tools` does); yield the retrievers started."""
    services = (s for s in services_of(tools) if isinstance(s, LocalRetrieverService))
    async with AsyncExitStack() as stack:
        opened = (replace(s, startup_timeout=startup_timeout).open() for s in services)
        yield await open_each(stack, opened)
