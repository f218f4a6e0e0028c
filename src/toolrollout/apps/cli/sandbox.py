"""``toolrollout sandbox serve``: a Sandbox Fusion-compatible code sandbox on this machine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from toolrollout.apps.cli._common import fail, require_extra
from toolrollout.apps.cli._options import SERVER, command, opt

__all__ = ["OPTIONS", "register", "serve"]

sandbox_app = typer.Typer(
    name="sandbox",
    help="Run code for tool calls: a local Sandbox Fusion-compatible sandbox.",
    no_args_is_help=True,
    add_completion=False,
)

# fmt: off
OPTIONS = [
    SERVER["host"],
    opt("port", int, 8080, "TCP port (Sandbox Fusion's default is 8080)."),
    opt("max_concurrency", int | None, None, "Programs running at once (default: the number "
        "of CPUs).", min=1),
    opt("unsafe_no_isolation", bool, False, "Run code WITHOUT bubblewrap: programs can read "
        "and write what this user can and reach the network. Only for trusted code on a "
        "throwaway machine.", "--unsafe-no-isolation"),
    opt("memory_limit_mb", int, 1024, "Memory limit per process (address space for python "
        "and bash, data for the other languages), and the cap of requests.", min=1),
    opt("compile_memory_limit_mb", int, 2048, "Memory limit (RLIMIT_DATA) of a compile step.",
        min=1),
    opt("max_processes", int, 64, "Processes and threads per run (RLIMIT_NPROC).", min=1),
    opt("max_file_size_mb", int, 64, "Largest file a program may write (RLIMIT_FSIZE).",
        min=1),
    opt("max_output_bytes", int, 128 * 1024, "Bytes of stdout and of stderr kept per run.",
        min=0),
    opt("max_run_timeout", float, 300.0, "Cap on a request's run_timeout (seconds).",
        min=0.001),
    opt("tmp_size_mb", int, 256, "Size of the private /tmp.", min=1),
    opt("python", Path | None, None, "Interpreter for python code (default: this one, without "
        "its virtualenv).", dir_okay=False),
    opt("program", list[str] | None, None, "NAME=PATH: the program a language runs with, e.g. "
        "tsx=.sandbox-runtime/node/node_modules/.bin/tsx (repeatable; default: NAME on "
        "/usr/local/bin:/usr/bin:/bin).", "--program"),
    opt("read_only", list[Path] | None, None, "Extra host path the programs may read "
        "(repeatable).", "--ro-bind", exists=True),
    SERVER["log_level"], SERVER["api_key"], SERVER["insecure"],
    SERVER["max_body_mb"].but(default=16.0), SERVER["max_requests"].but(default=256),
]
_AS_GIVEN = ("memory_limit_mb", "compile_memory_limit_mb", "max_processes", "max_file_size_mb",
             "max_output_bytes", "max_run_timeout", "tmp_size_mb")
"""The options :class:`SandboxServerConfig` takes as they are (same name)."""
# fmt: on


def serve(flags: Any) -> None:
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

    options: dict[str, Any] = {name: getattr(flags, name) for name in _AS_GIVEN}
    if flags.max_concurrency is not None:
        options["max_concurrency"] = flags.max_concurrency
    if flags.python is not None:
        options["python"] = str(flags.python.absolute())
    programs: dict[str, str] = {}
    for item in flags.program or ():
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise fail(f"--program wants NAME=PATH, got {item!r}")
        programs[name] = str(Path(path).absolute()) if "/" in path else path
    try:
        config = SandboxServerConfig(
            isolation="none" if flags.unsafe_no_isolation else "bwrap",
            programs=programs,
            read_only_paths=tuple(str(p) for p in flags.read_only or ()),
            **options,
        )
        if flags.unsafe_no_isolation:
            typer.echo(
                "warning: --unsafe-no-isolation: code runs WITHOUT isolation (same user, "
                "files and network as this server)",
                err=True,
            )
        security = sandbox_security(
            api_key=flags.api_key or None,
            max_body_bytes=int(flags.max_body_mb * 1024 * 1024),
            max_concurrent_requests=flags.max_requests,
        )
        run_sandbox_server(
            config,
            host=flags.host,
            port=flags.port,
            log_level=flags.log_level,
            security=security,
            insecure=flags.insecure,
        )
    except UserError as exc:  # SandboxIsolationError included: no working bubblewrap
        raise fail(str(exc)) from None


def register(app: typer.Typer) -> None:
    """Add the ``sandbox`` command group to the ``toolrollout`` app."""
    command(sandbox_app, "serve", OPTIONS, serve)
    app.add_typer(sandbox_app, name="sandbox")
