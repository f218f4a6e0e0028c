"""``toolrollout serve``: an SGLang-compatible HTTP server on the embedded engine."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from toolrollout.apps.cli._common import (
    AdminApiKeyOption,
    ApiKeyOption,
    InsecureOption,
    MaxBodyMbOption,
    MaxRequestsOption,
    fail,
    require_extra,
)

__all__ = ["register", "serve"]


def serve(
    model: Annotated[
        Path | None,
        typer.Option(
            "--model",
            "--model-path",
            help="Hugging Face model folder. Default: the bundled demo model.",
            file_okay=False,
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port (SGLang's default is 30000).")] = 30000,
    max_batch_size: Annotated[
        int, typer.Option(min=1, help="Most sequences decoded together; more requests wait.")
    ] = 32,
    context_length: Annotated[
        int | None,
        typer.Option(help="Prompt + max_new_tokens limit. Default: the model config's."),
    ] = None,
    device: Annotated[
        str | None, typer.Option(help="cpu, cuda, cuda:1... Default: CUDA when available.")
    ] = None,
    dtype: Annotated[str | None, typer.Option(help="float32, bfloat16, float16 or auto.")] = None,
    weight_version: Annotated[
        str, typer.Option(help="Reported as meta_info.weight_version.")
    ] = "default",
    threads: Annotated[
        int | None, typer.Option(min=1, help="Torch threads of the engine (1 suits tiny models).")
    ] = None,
    served_model_name: Annotated[
        str | None, typer.Option(help="Name reported by /v1/models and /server_info.")
    ] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
    api_key: ApiKeyOption = None,
    admin_api_key: AdminApiKeyOption = None,
    insecure: InsecureOption = False,
    weights_dir: Annotated[
        list[Path] | None,
        typer.Option(
            "--weights-dir",
            help="Folder whose model folders /update_weights_from_disk may load (repeatable). "
            "Default: only the served --model folder.",
            file_okay=False,
        ),
    ] = None,
    max_body_mb: MaxBodyMbOption = 64.0,
    max_requests: MaxRequestsOption = 4096,
) -> None:
    """Serve a model with SGLang's native API (/generate, /health, /abort_request, ...).

    Keys: --api-key / TOOLROLLOUT_API_KEY and --admin-api-key / TOOLROLLOUT_ADMIN_API_KEY
    (docs/security.md); a non-loopback --host needs one unless --insecure.
    """
    require_extra("serve", "toolrollout serve")
    from toolrollout._exceptions import UserError
    from toolrollout._security import check_bind
    from toolrollout.apps.server import default_security

    security = default_security(
        api_key=api_key or None,
        admin_api_key=admin_api_key or None,
        max_body_bytes=int(max_body_mb * 1024 * 1024),
        max_concurrent_requests=max_requests,
    )
    if not insecure:  # refuse before torch loads; run_server logs the --insecure warning
        try:
            check_bind(host, security, insecure=False, server="toolrollout serve")
        except UserError as exc:
            raise fail(str(exc)) from None
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

    from toolrollout.apps.server import run_server

    run_server(
        model,
        host,
        port,
        max_batch_size=max_batch_size,
        context_length=context_length,
        device=device,
        dtype=dtype,
        weight_version=weight_version,
        num_threads=threads,
        served_model_name=served_model_name,
        log_level=log_level,
        security=security,
        insecure=insecure,
        weights_dirs=tuple(weights_dir or ()),
    )


def register(app: typer.Typer) -> None:
    """Add the ``serve`` command to the ``toolrollout`` app."""
    app.command("serve")(serve)
