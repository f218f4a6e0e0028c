"""``toolrollout gateway``: an OpenAI/Anthropic-compatible proxy that records sessions.

Point a harness's base URL at ``http://127.0.0.1:<port>/v1``; every session it runs is
written to ``--out`` as token-exact trajectory rows (one per segment), crash-safe shards in
``<out>.parts/`` while it runs, merged into ``<out>`` on shutdown (Ctrl-C / SIGTERM).
The engine and model options are ``generate``'s (the embedded demo model by default).
See docs/gateway.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from toolrollout.apps.cli._common import fail, parse_template_kwargs, require_extra
from toolrollout.apps.cli._options import RUN, SERVER, command, opt, pick, spec_from, user_message

if TYPE_CHECKING:
    from toolrollout._security import ServerSecurity
    from toolrollout.apps.gateway import GatewayConfig
    from toolrollout.spec import RunSpec

__all__ = ["OPTIONS", "gateway", "register"]

# fmt: off
OPTIONS = [
    *pick(RUN, "engine_url", "engine", "engine_api_key", "model", "family",
          "chat_template_kwargs"),
    RUN["tool_parser"].but(help="Tool-call format of the model. Default: its family's."),
    SERVER["host"],
    opt("port", int, 8400, "TCP port.", min=0, max=65535),
    opt("out", Path, Path("gateway_sessions.parquet"), "Recorded sessions, .parquet or .jsonl "
        "(one row per segment)."),
    opt("served_model_name", str, "toolrollout", "Model name /v1/models reports and answers "
        "carry."),
    opt("max_tokens", int, 1024, "Tokens per answer when a request sets no max_tokens.", min=1),
    opt("context_length", int | None, None, "Context limit. Default: the engine's.", min=1),
    opt("max_concurrency", int, 64, "Generations in flight at once; more wait in line.", min=1),
    opt("max_waiting", int, 1024, "Requests waiting in line; more get 429 at once.", min=1),
    RUN["request_timeout"].but(help="Seconds one request may take (then 504, aborted)."),
    opt("idle_timeout", float, 600.0, "Seconds without a request before a session is closed "
        "and written (0: only when closed explicitly).", min=0.0),
    opt("max_segments", int, 64, "Segments one session may hold (bounds its memory).", min=1),
    opt("max_n", int, 16, "Largest n (choices) per request.", min=1),
    opt("max_stored_responses", int, 1024, "Responses kept for previous_response_id and GET "
        "/v1/responses/{id} (least recently used dropped first).", min=1),
    RUN["flush_every"],
    RUN["threads"].but(help="Torch threads of the embedded engine."),
    RUN["health_timeout"],
    SERVER["api_key"], SERVER["admin_api_key"], SERVER["insecure"], SERVER["max_body_mb"],
    SERVER["log_level"].but(default="warning"),
]
"""The options of ``gateway``: ``generate``'s engine and model options and its own."""
_CONFIG_FLAGS = ("family", "tool_parser", "context_length", "max_n", "max_concurrency",
                 "max_waiting", "request_timeout", "max_segments", "max_stored_responses")
"""The options :class:`GatewayConfig` takes as they are (same name)."""
# fmt: on


def gateway(flags: Any) -> None:
    """Serve OpenAI Chat Completions / Responses and Anthropic Messages, recording sessions.

    A non-loopback --host needs --api-key / TOOLROLLOUT_API_KEY unless --insecure.
    """
    require_extra("cli", "toolrollout gateway")
    require_extra("sandbox", "toolrollout gateway")  # fastapi and uvicorn
    from toolrollout._exceptions import ToolRolloutError
    from toolrollout._security import ServerSecurity, check_bind

    security = ServerSecurity(
        api_key=flags.api_key or None,
        admin_api_key=flags.admin_api_key or None,
        max_body_bytes=int(flags.max_body_mb * 1024 * 1024),
    )
    try:
        check_bind(flags.host, security, insecure=flags.insecure, server="the gateway")
        spec = spec_from(flags, OPTIONS)
        from toolrollout.apps.gateway import GatewayConfig

        config = GatewayConfig(
            model_name=flags.served_model_name,
            template_kwargs=parse_template_kwargs(flags.chat_template_kwargs),
            default_max_tokens=flags.max_tokens,
            idle_timeout=flags.idle_timeout or None,
            **{name: getattr(flags, name) for name in _CONFIG_FLAGS},
        )
        summary = _serve(spec, config, security, flags.host, flags.port, flags.out, flags.log_level)
    except ToolRolloutError as exc:
        raise fail(user_message(exc, OPTIONS)) from None
    except OSError as exc:
        raise fail(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")) from None
    typer.echo(
        f"gateway: {summary['sessions']} sessions, {summary['rows_written']} rows -> {flags.out}",
        err=True,
    )


def _serve(
    spec: RunSpec,
    config: GatewayConfig,
    security: ServerSecurity,
    host: str,
    port: int,
    out: Path,
    log_level: str,
) -> dict[str, Any]:
    import asyncio
    import contextlib
    import signal

    import uvicorn

    from toolrollout.apps.gateway import Gateway, build_app, gateway_security

    class Server(uvicorn.Server):
        """uvicorn re-raises a captured SIGINT/SIGTERM once it has stopped, which would end
        the process before the gateway writes its sessions; this one only stops."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            loop = asyncio.get_running_loop()
            signals = (signal.SIGINT, signal.SIGTERM)
            for sig in signals:
                loop.add_signal_handler(sig, self.handle_exit, sig, None)
            try:
                yield
            finally:
                for sig in signals:
                    loop.remove_signal_handler(sig)

    async def main() -> dict[str, Any]:
        async with Gateway.open(spec, config=config, out=out) as gw:
            guarded = gateway_security(
                gw,
                api_key=security.api_key,
                admin_api_key=security.admin_api_key,
                max_body_bytes=security.max_body_bytes,
            )
            app = build_app(gw, security=guarded)
            server = Server(uvicorn.Config(app, host=host, port=port, log_level=log_level))
            typer.echo(
                f"gateway: serving {config.model_name} on http://{host}:{port}/v1, "
                f"sessions -> {out}",
                err=True,
            )
            await server.serve()
        return dict(gw.stats)

    return asyncio.run(main())


def register(app: typer.Typer) -> None:
    """Add the ``gateway`` command to the ``toolrollout`` app."""
    command(app, "gateway", OPTIONS, gateway)
