"""The local sandbox's HTTP API: Sandbox Fusion's ``POST /run_code`` and ``GET /v1/ping``,
plus ``GET /health`` and ``GET /server_info``; the API key guards all but health and ping
(``/server_info`` describes the host)."""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from toolrollout._security import (
    OPEN_PATH_PREFIXES,
    SecurityMiddleware,
    ServerSecurity,
    check_bind,
)
from toolrollout._version import __version__

from ._protocol import RunCodeRequest, RunCodeResponse, RunStatus
from ._runner import SandboxRunner, SandboxServerConfig

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_CONCURRENT_REQUESTS",
    "create_sandbox_app",
    "run_sandbox_server",
    "sandbox_security",
]

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
"""Largest ``/run_code`` body by default (program, stdin and uploaded files together)."""
DEFAULT_MAX_CONCURRENT_REQUESTS = 256
"""Requests in flight at once by default; past the program slots they wait in the runner,
past this they get 429 (the sandbox tool retries those)."""


def sandbox_security(**changes: Any) -> ServerSecurity:
    """The sandbox's :class:`ServerSecurity`: default limits, ``/v1/ping`` open."""
    base = ServerSecurity(
        open_paths=(*OPEN_PATH_PREFIXES, "/v1/ping"),
        max_body_bytes=DEFAULT_MAX_BODY_BYTES,
        max_concurrent_requests=DEFAULT_MAX_CONCURRENT_REQUESTS,
    )
    return dataclasses.replace(base, **changes)


def create_sandbox_app(runner: SandboxRunner, *, security: ServerSecurity | None = None) -> FastAPI:
    """A FastAPI app serving ``runner`` with Sandbox Fusion's API, guarded by ``security``
    (default: :func:`sandbox_security`, no key)."""
    from fastapi import FastAPI

    app = FastAPI(
        title="toolrollout sandbox",
        version=__version__,
        description="Sandbox Fusion-compatible /run_code (python, bash and the compiled and "
        "scripting languages whose toolchain is installed), isolated with bubblewrap.",
    )
    app.add_middleware(
        SecurityMiddleware,
        security=security if security is not None else sandbox_security(),
    )

    @app.post("/run_code", response_model=RunCodeResponse, tags=["sandbox"])
    async def run_code(request: RunCodeRequest) -> RunCodeResponse:
        try:
            return await runner.run(request)
        except Exception as exc:  # the answer Sandbox Fusion gives for its own failures
            logger.exception("sandbox: running a %s request failed", request.language)
            return RunCodeResponse(
                status=RunStatus.SandboxError, message=f"{type(exc).__name__}: {exc}"
            )

    @app.get("/v1/ping")
    async def ping() -> str:
        return "pong"

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/server_info")
    async def server_info() -> dict[str, Any]:
        return runner.describe()

    return app


def run_sandbox_server(
    config: SandboxServerConfig | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    log_level: str = "info",
    security: ServerSecurity | None = None,
    insecure: bool = False,
) -> None:
    """Check the bind address (:func:`check_bind`) and the isolation, then serve until
    interrupted (blocking)."""
    import uvicorn

    security = security if security is not None else sandbox_security()
    check_bind(host, security, insecure=insecure, server="the sandbox")
    runner = SandboxRunner(config)
    if runner.isolation == "none":
        logger.warning(
            "sandbox: running code WITHOUT isolation (--unsafe-no-isolation): programs can "
            "read and write anything this user can, and reach the network"
        )
    app = create_sandbox_app(runner, security=security)
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)
