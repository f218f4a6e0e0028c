"""``toolrollout serve``: an SGLang-compatible HTTP server on the embedded engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from toolrollout.apps.cli._common import fail, require_extra
from toolrollout.apps.cli._options import SERVER, command, opt

__all__ = ["OPTIONS", "register", "serve"]

# fmt: off
OPTIONS = [
    opt("model", Path | None, None, "Hugging Face model folder. Default: the bundled demo "
        "model.", "--model", "--model-path", file_okay=False),
    SERVER["host"],
    opt("port", int, 30000, "TCP port (SGLang's default is 30000)."),
    opt("max_batch_size", int, 32, "Most sequences decoded together; more requests wait.",
        min=1),
    opt("context_length", int | None, None, "Prompt + max_new_tokens limit. Default: the "
        "model config's."),
    opt("device", str | None, None, "cpu, cuda, cuda:1... Default: CUDA when available."),
    opt("dtype", str | None, None, "float32, bfloat16, float16 or auto."),
    opt("weight_version", str, "default", "Reported as meta_info.weight_version."),
    opt("threads", int | None, None, "Torch threads of the engine (1 suits tiny models).",
        min=1),
    opt("served_model_name", str | None, None, "Name reported by /v1/models and /server_info."),
    SERVER["log_level"], SERVER["api_key"], SERVER["admin_api_key"], SERVER["insecure"],
    opt("weights_dir", list[Path] | None, None, "Folder whose model folders "
        "/update_weights_from_disk may load (repeatable). Default: only the served --model "
        "folder.", "--weights-dir", file_okay=False),
    SERVER["max_body_mb"], SERVER["max_requests"],
]
_AS_GIVEN = ("max_batch_size", "context_length", "device", "dtype", "weight_version",
             "served_model_name", "log_level")
"""The options :func:`run_server` takes as they are (same name)."""
# fmt: on


def serve(flags: Any) -> None:
    """Serve a model with SGLang's native API (/generate, /health, /abort_request, ...).

    Keys: --api-key / TOOLROLLOUT_API_KEY and --admin-api-key / TOOLROLLOUT_ADMIN_API_KEY
    (docs/security.md); a non-loopback --host needs one unless --insecure.
    """
    require_extra("serve", "toolrollout serve")
    from toolrollout._exceptions import UserError
    from toolrollout._security import check_bind
    from toolrollout.apps.server import default_security, run_server

    security = default_security(
        api_key=flags.api_key or None,
        admin_api_key=flags.admin_api_key or None,
        max_body_bytes=int(flags.max_body_mb * 1024 * 1024),
        max_concurrent_requests=flags.max_requests,
    )
    if not flags.insecure:  # refuse before torch loads; run_server logs the --insecure warning
        try:
            check_bind(flags.host, security, insecure=False, server="toolrollout serve")
        except UserError as exc:
            raise fail(str(exc)) from None
    model = flags.model
    if model is None:
        from toolrollout.apps.demo import DEMO_MODEL_PATH

        model = DEMO_MODEL_PATH
        if not (model / "config.json").is_file():
            typer.echo(
                f"The bundled demo model is missing at {model}; pass --model PATH "
                "(or train it with `python -m toolrollout.apps.demo.train`).",
                err=True,
            )
            raise typer.Exit(code=2)
    run_server(
        model,
        flags.host,
        flags.port,
        num_threads=flags.threads,
        security=security,
        insecure=flags.insecure,
        weights_dirs=tuple(flags.weights_dir or ()),
        **{name: getattr(flags, name) for name in _AS_GIVEN},
    )


def register(app: typer.Typer) -> None:
    """Add the ``serve`` command to the ``toolrollout`` app."""
    command(app, "serve", OPTIONS, serve)
