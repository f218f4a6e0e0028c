"""MCP servers over HTTP that the run starts itself (``command`` and ``url`` in one entry),
supervised (:mod:`toolrollout._supervisor`; liveness probe: any answer to ``GET /``)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Hashable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from toolrollout._net import is_listening
from toolrollout._port_records import claim_port
from toolrollout._security import keyless_environ
from toolrollout._supervisor import RestartPolicy, ServiceCommand, SupervisedService, supervise

from ._servers import HttpServer

__all__ = ["LocalMcpHttpService"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LocalMcpHttpService:
    """A launched HTTP MCP server on its port: the :class:`~toolrollout.tools.ToolService`
    that an MCP tool of that server needs before its sessions can connect."""

    spec: HttpServer
    startup_timeout: float = 60.0
    restart: RestartPolicy | None = None

    @property
    def host(self) -> str:
        host = urlsplit(self.spec.url).hostname or "127.0.0.1"
        return "127.0.0.1" if host == "localhost" else host

    @property
    def port(self) -> int:
        port = urlsplit(self.spec.url).port
        assert port is not None  # checked when the entry was read
        return port

    @property
    def key(self) -> Hashable:
        return ("toolrollout.tools.mcp.http", self.port)

    @asynccontextmanager
    async def open(self) -> AsyncIterator[SupervisedService | None]:
        """Start the server, supervised; yield it (None: this process serves it already)."""
        spec = self.spec
        assert spec.command is not None
        host, port = self.host, self.port
        if await claim_port("mcp-http", host, port, (spec.command, *spec.args)):
            yield None
            return

        async def ready(client: httpx.AsyncClient) -> bool:
            return await is_listening(host, port)

        origin = f"{urlsplit(spec.url).scheme}://{urlsplit(spec.url).netloc}/"

        async def live(client: httpx.AsyncClient) -> bool:
            # Any HTTP answer (a 404 included) needs the server's own code to run; a TCP
            # connect does not (the kernel accepts for a stopped process too).
            await client.get(origin)
            return True

        command = ServiceCommand(
            kind="mcp-http",
            argv=(spec.command, *spec.args),
            host=host,
            port=port,
            ready=ready,
            live=live,
            env={**keyless_environ(), **spec.env},
            cwd=spec.cwd,
            startup_timeout=self.startup_timeout,
        )
        async with supervise(command, self.restart) as service:
            logger.info("MCP server %r is up at %s (pid %d)", spec.name, spec.url, service.pid)
            yield service
