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
from typing import TYPE_CHECKING, Annotated, Any

import typer

from toolrollout.apps.cli._common import (
    AdminApiKeyOption,
    ApiKeyOption,
    ChatTemplateKwargsOption,
    EngineApiKeyOption,
    EngineKindOption,
    EngineUrlsOption,
    FamilyOption,
    InsecureOption,
    MaxBodyMbOption,
    ModelOption,
    fail,
    parse_template_kwargs,
    require_extra,
)

if TYPE_CHECKING:
    from toolrollout._security import ServerSecurity
    from toolrollout.apps.gateway import GatewayConfig
    from toolrollout.spec import RunSpec

__all__ = ["gateway", "register"]


def gateway(
    engine_url: EngineUrlsOption = None,
    engine: EngineKindOption = "auto",
    engine_api_key: EngineApiKeyOption = None,
    model: ModelOption = None,
    family: FamilyOption = None,
    chat_template_kwargs: ChatTemplateKwargsOption = None,
    tool_parser: Annotated[
        str | None, typer.Option(help="Tool-call format of the model. Default: its family's.")
    ] = None,
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port.")] = 8400,
    out: Annotated[
        Path, typer.Option(help="Recorded sessions, .parquet or .jsonl (one row per segment).")
    ] = Path("gateway_sessions.parquet"),
    served_model_name: Annotated[
        str, typer.Option(help="Model name /v1/models reports and answers carry.")
    ] = "toolrollout",
    max_tokens: Annotated[
        int, typer.Option(min=1, help="Tokens per answer when a request sets no max_tokens.")
    ] = 1024,
    context_length: Annotated[
        int | None, typer.Option(min=1, help="Context limit. Default: the engine's.")
    ] = None,
    max_concurrency: Annotated[
        int, typer.Option(min=1, help="Generations in flight at once; more wait in line.")
    ] = 64,
    max_waiting: Annotated[
        int, typer.Option(min=1, help="Requests waiting in line; more get 429 at once.")
    ] = 1024,
    request_timeout: Annotated[
        float, typer.Option(min=0.1, help="Seconds one request may take (then 504, aborted).")
    ] = 600.0,
    idle_timeout: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="Seconds without a request before a session is "
            "closed and written (0: only when closed explicitly).",
        ),
    ] = 600.0,
    max_segments: Annotated[
        int, typer.Option(min=1, help="Segments one session may hold (bounds its memory).")
    ] = 64,
    max_n: Annotated[int, typer.Option(min=1, help="Largest n (choices) per request.")] = 16,
    max_stored_responses: Annotated[
        int,
        typer.Option(
            min=1,
            help="Responses kept for previous_response_id and GET /v1/responses/{id} "
            "(least recently used dropped first).",
        ),
    ] = 1024,
    flush_every: Annotated[
        int, typer.Option(min=1, help="Rows per crash-safe shard (at most this many are lost).")
    ] = 64,
    threads: Annotated[int, typer.Option(min=1, help="Torch threads of the embedded engine.")] = 1,
    health_timeout: Annotated[
        float, typer.Option(help="Seconds to wait for --engine-url servers to be healthy.")
    ] = 120.0,
    api_key: ApiKeyOption = None,
    admin_api_key: AdminApiKeyOption = None,
    insecure: InsecureOption = False,
    max_body_mb: MaxBodyMbOption = 64.0,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "warning",
) -> None:
    """Serve OpenAI Chat Completions / Responses and Anthropic Messages, recording sessions.

    A non-loopback --host needs --api-key / TOOLROLLOUT_API_KEY unless --insecure.
    """
    require_extra("cli", "toolrollout gateway")
    require_extra("sandbox", "toolrollout gateway")  # fastapi and uvicorn
    from toolrollout._exceptions import ToolRolloutError
    from toolrollout._security import ServerSecurity, check_bind

    security = ServerSecurity(
        api_key=api_key or None,
        admin_api_key=admin_api_key or None,
        max_body_bytes=int(max_body_mb * 1024 * 1024),
    )
    try:
        check_bind(host, security, insecure=insecure, server="the gateway")
        spec = _spec(
            engine_url,
            engine,
            engine_api_key,
            model,
            family,
            chat_template_kwargs,
            tool_parser,
            threads,
            health_timeout,
            request_timeout,
            flush_every,
        )
        from toolrollout.apps.gateway import GatewayConfig

        config = GatewayConfig(
            model_name=served_model_name,
            family=family,
            tool_parser=tool_parser,
            template_kwargs=parse_template_kwargs(chat_template_kwargs),
            context_length=context_length,
            default_max_tokens=max_tokens,
            max_n=max_n,
            max_concurrency=max_concurrency,
            max_waiting=max_waiting,
            request_timeout=request_timeout,
            idle_timeout=idle_timeout or None,
            max_segments=max_segments,
            max_stored_responses=max_stored_responses,
        )
        summary = _serve(spec, config, security, host, port, out, log_level)
    except ToolRolloutError as exc:
        raise fail(str(exc)) from None
    except OSError as exc:
        raise fail(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")) from None
    typer.echo(
        f"gateway: {summary['sessions']} sessions, {summary['rows_written']} rows -> {out}",
        err=True,
    )


def _spec(
    engine_url: list[str] | None,
    engine: str,
    engine_api_key: str | None,
    model: Path | None,
    family: str | None,
    chat_template_kwargs: str | None,
    tool_parser: str | None,
    threads: int,
    health_timeout: float,
    request_timeout: float,
    flush_every: int,
) -> RunSpec:
    from toolrollout.apps.demo import DEMO_MODEL_PATH
    from toolrollout.rollout import RolloutConfig
    from toolrollout.spec import RunSpec

    return RunSpec(
        engine_urls=tuple(engine_url or ()),
        engine=engine,  # type: ignore[arg-type]  # RunSpec checks it
        engine_api_key=engine_api_key or None,
        model=model or DEMO_MODEL_PATH,
        config=RolloutConfig(
            family=family,
            tool_parser=tool_parser,
            chat_template_kwargs=parse_template_kwargs(chat_template_kwargs),
        ),
        threads=threads,
        health_timeout=health_timeout,
        request_timeout=request_timeout,
        flush_every=flush_every,
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
    app.command("gateway")(gateway)
