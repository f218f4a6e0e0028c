"""``toolrollout sandbox serve``: a Sandbox Fusion-compatible code sandbox on this machine."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from toolrollout.apps.cli._common import (
    ApiKeyOption,
    InsecureOption,
    MaxBodyMbOption,
    MaxRequestsOption,
    require_extra,
)

__all__ = ["register", "serve"]

sandbox_app = typer.Typer(
    name="sandbox",
    help="Run code for tool calls: a local Sandbox Fusion-compatible sandbox.",
    no_args_is_help=True,
    add_completion=False,
)


@sandbox_app.command("serve")
def serve(
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port (Sandbox Fusion's default is 8080).")] = 8080,
    max_concurrency: Annotated[
        int | None,
        typer.Option(min=1, help="Programs running at once (default: the number of CPUs)."),
    ] = None,
    unsafe_no_isolation: Annotated[
        bool,
        typer.Option(
            "--unsafe-no-isolation",
            help="Run code WITHOUT bubblewrap: programs can read and write what this user "
            "can and reach the network. Only for trusted code on a throwaway machine.",
        ),
    ] = False,
    memory_limit_mb: Annotated[
        int,
        typer.Option(
            min=1,
            help="Memory limit per process (address space for python and bash, data for the "
            "other languages), and the cap of requests.",
        ),
    ] = 1024,
    compile_memory_limit_mb: Annotated[
        int, typer.Option(min=1, help="Memory limit (RLIMIT_DATA) of a compile step.")
    ] = 2048,
    max_processes: Annotated[
        int, typer.Option(min=1, help="Processes and threads per run (RLIMIT_NPROC).")
    ] = 64,
    max_file_size_mb: Annotated[
        int, typer.Option(min=1, help="Largest file a program may write (RLIMIT_FSIZE).")
    ] = 64,
    max_output_bytes: Annotated[
        int, typer.Option(min=0, help="Bytes of stdout and of stderr kept per run.")
    ] = 128 * 1024,
    max_run_timeout: Annotated[
        float, typer.Option(min=0.001, help="Cap on a request's run_timeout (seconds).")
    ] = 300.0,
    tmp_size_mb: Annotated[int, typer.Option(min=1, help="Size of the private /tmp.")] = 256,
    python: Annotated[
        Path | None,
        typer.Option(
            help="Interpreter for python code (default: this one, without its virtualenv).",
            dir_okay=False,
        ),
    ] = None,
    program: Annotated[
        list[str] | None,
        typer.Option(
            "--program",
            help="NAME=PATH: the program a language runs with, e.g. "
            "tsx=.sandbox-runtime/node/node_modules/.bin/tsx (repeatable; default: NAME on "
            "/usr/local/bin:/usr/bin:/bin).",
        ),
    ] = None,
    read_only: Annotated[
        list[Path] | None,
        typer.Option(
            "--ro-bind", help="Extra host path the programs may read (repeatable).", exists=True
        ),
    ] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
    api_key: ApiKeyOption = None,
    insecure: InsecureOption = False,
    max_body_mb: MaxBodyMbOption = 16.0,
    max_requests: MaxRequestsOption = 256,
) -> None:
    """Serve Sandbox Fusion's POST /run_code isolated with bubblewrap.

    Runs python and bash, and c, cpp, go, java, nodejs, typescript, rust, perl, ruby and lua
    where their toolchain is installed (GET /server_info lists them; it needs the key, as
    /run_code does).

    Also GET /v1/ping and GET /health (open without a key; up or down, nothing more).
    Refuses to start (exit status 2) without a working bwrap unless --unsafe-no-isolation is
    given, and on a non-loopback --host without --api-key / TOOLROLLOUT_API_KEY unless
    --insecure (docs/security.md).
    """
    require_extra("sandbox", "toolrollout sandbox serve")
    from toolrollout._exceptions import UserError
    from toolrollout.sandbox._runner import SandboxServerConfig
    from toolrollout.sandbox._server import run_sandbox_server, sandbox_security

    options: dict[str, object] = {}
    if max_concurrency is not None:
        options["max_concurrency"] = max_concurrency
    if python is not None:
        options["python"] = str(python.absolute())
    programs: dict[str, str] = {}
    for item in program or ():
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            typer.echo(f"error: --program wants NAME=PATH, got {item!r}", err=True)
            raise typer.Exit(code=2)
        programs[name] = str(Path(path).absolute()) if "/" in path else path
    try:
        config = SandboxServerConfig(
            isolation="none" if unsafe_no_isolation else "bwrap",
            memory_limit_mb=memory_limit_mb,
            compile_memory_limit_mb=compile_memory_limit_mb,
            programs=programs,
            max_processes=max_processes,
            max_file_size_mb=max_file_size_mb,
            max_output_bytes=max_output_bytes,
            max_run_timeout=max_run_timeout,
            tmp_size_mb=tmp_size_mb,
            read_only_paths=tuple(str(p) for p in read_only or ()),
            **options,  # type: ignore[arg-type]
        )
        if unsafe_no_isolation:
            typer.echo(
                "warning: --unsafe-no-isolation: code runs WITHOUT isolation (same user, "
                "files and network as this server)",
                err=True,
            )
        security = sandbox_security(
            api_key=api_key or None,
            max_body_bytes=int(max_body_mb * 1024 * 1024),
            max_concurrent_requests=max_requests,
        )
        run_sandbox_server(
            config,
            host=host,
            port=port,
            log_level=log_level,
            security=security,
            insecure=insecure,
        )
    except UserError as exc:  # SandboxIsolationError included: no working bubblewrap
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None


def register(app: typer.Typer) -> None:
    """Add the ``sandbox`` command group to the ``toolrollout`` app."""
    app.add_typer(sandbox_app, name="sandbox")
