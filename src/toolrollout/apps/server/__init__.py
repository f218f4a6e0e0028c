"""``toolrollout serve``: SGLang's native HTTP API in front of the embedded engine.

:func:`create_app` builds the FastAPI app for an :class:`EmbeddedEngine`;
:func:`run_server` loads a model and serves it with uvicorn until interrupted.
"""

from __future__ import annotations

import os
from typing import Any

from toolrollout._extras import require_extra

require_extra("serve", "toolrollout.apps.server")

from toolrollout._security import ServerSecurity, check_bind  # noqa: E402
from toolrollout.apps.server._app import create_app, default_security  # noqa: E402

__all__ = ["create_app", "default_security", "run_server"]


def run_server(
    model_path: str | os.PathLike[str],
    host: str = "127.0.0.1",
    port: int = 30000,
    *,
    served_model_name: str | None = None,
    log_level: str = "info",
    security: ServerSecurity | None = None,
    insecure: bool = False,
    weights_dirs: tuple[str | os.PathLike[str], ...] = (),
    **engine_options: Any,
) -> None:
    """Serve ``model_path`` on ``host:port`` (blocking; Ctrl-C stops it cleanly);
    ``engine_options`` are :class:`EmbeddedEngine`'s (``max_batch_size``, ``device``...).

    A non-loopback ``host`` needs ``security.api_key`` unless ``insecure``
    (:func:`~toolrollout._security.check_bind`), checked before the model loads.
    """
    import uvicorn

    security = security if security is not None else default_security()
    check_bind(host, security, insecure=insecure, server="toolrollout serve")

    from toolrollout.engines.embedded import EmbeddedEngine

    engine = EmbeddedEngine(model_path, **engine_options)
    app = create_app(
        engine, served_model_name=served_model_name, security=security, weights_dirs=weights_dirs
    )
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_keep_alive=5)
