"""``toolrollout serve``: SGLang's native HTTP API in front of the embedded engine.

:func:`create_app` builds the FastAPI app for an :class:`EmbeddedEngine`;
:func:`run_server` loads a model and serves it with uvicorn until interrupted.
"""

from __future__ import annotations

import os

from toolrollout._extras import require_extra

require_extra("serve", "toolrollout.server")

from toolrollout.server._app import create_app  # noqa: E402

__all__ = ["create_app", "run_server"]


def run_server(
    model_path: str | os.PathLike[str],
    host: str = "127.0.0.1",
    port: int = 30000,
    *,
    max_batch_size: int = 32,
    context_length: int | None = None,
    device: str | None = None,
    dtype: str | None = None,
    weight_version: str = "default",
    num_threads: int | None = None,
    served_model_name: str | None = None,
    log_level: str = "info",
) -> None:
    """Serve ``model_path`` on ``host:port`` (blocking; Ctrl-C stops it cleanly)."""
    import uvicorn

    from toolrollout.engines.embedded import EmbeddedEngine

    engine = EmbeddedEngine(
        model_path,
        max_batch_size=max_batch_size,
        context_length=context_length,
        device=device,
        dtype=dtype,
        weight_version=weight_version,
        num_threads=num_threads,
    )
    app = create_app(engine, served_model_name=served_model_name)
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_keep_alive=5)
