"""The local sandbox's HTTP API: Sandbox Fusion's ``POST /run_code`` and ``GET /v1/ping``,
plus ``GET /health`` (isolation mode, slots in use)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from toolrollout._version import __version__

from ._protocol import RunCodeRequest, RunCodeResponse, RunStatus
from ._runner import SandboxRunner, SandboxServerConfig

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = ["create_sandbox_app", "run_sandbox_server"]

logger = logging.getLogger(__name__)


def create_sandbox_app(runner: SandboxRunner) -> FastAPI:
    """A FastAPI app serving ``runner`` with Sandbox Fusion's API."""
    from fastapi import FastAPI

    app = FastAPI(
        title="toolrollout sandbox",
        version=__version__,
        description="Sandbox Fusion-compatible /run_code (python, bash and the compiled and "
        "scripting languages whose toolchain is installed), isolated with bubblewrap.",
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
    async def health() -> dict[str, Any]:
        return runner.describe()

    return app


def run_sandbox_server(
    config: SandboxServerConfig | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    log_level: str = "info",
) -> None:
    """Check the isolation, then serve until interrupted (blocking).

    Raises :class:`~toolrollout.exceptions.SandboxIsolationError` before binding the port when
    bubblewrap is missing or does not work and ``config.isolation`` is ``"bwrap"``.
    """
    import uvicorn

    runner = SandboxRunner(config)
    if runner.isolation == "none":
        logger.warning(
            "sandbox: running code WITHOUT isolation (--unsafe-no-isolation): programs can "
            "read and write anything this user can, and reach the network"
        )
    app = create_sandbox_app(runner)
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)
