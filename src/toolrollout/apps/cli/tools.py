"""``toolrollout tools``: check a tool config with no model running (``tools list``:
the schemas and limits; ``tools call``: one call through the rollout's executor)."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from toolrollout.apps.cli._common import fail

if TYPE_CHECKING:
    from toolrollout.tools import Tool, ToolLimits, ToolResult

__all__ = ["call", "list_tools", "register", "tools_app"]

tools_app = typer.Typer(
    name="tools",
    help="Inspect and try the tools of a tool config, with no model running.",
    no_args_is_help=True,
    add_completion=False,
)

ToolConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--tool-config",
        help="verl-layout tool config YAML. Default: the built-in calculator.",
    ),
]


def _load(tool_config: Path | None) -> list[Tool]:
    """The config's tools (or the calculator); user mistakes become ``error:`` + exit 2."""
    from toolrollout._exceptions import UserError
    from toolrollout.tools import ToolExecutor, calculator_tool, load_tool_config

    if tool_config is None:
        return [calculator_tool()]
    if not tool_config.exists():
        raise fail(f"tool config not found: {tool_config}")
    try:
        tools = load_tool_config(tool_config)
        ToolExecutor(tools)  # the same checks a run makes (e.g. duplicate names)
    except UserError as exc:
        # A config error may list several problems, one per line: keep them all.
        raise fail(str(exc)) from None
    return tools


@asynccontextmanager
async def _opened(tools: list[Tool]) -> AsyncIterator[None]:
    """The tools' services, open for the block; a service that cannot start is an
    ``error:`` line (exit 2), e.g. the local sandbox without bubblewrap."""
    from toolrollout._exceptions import ToolError, UserError
    from toolrollout.tools import open_tools

    async with AsyncExitStack() as stack:
        try:
            await stack.enter_async_context(open_tools(tools))
        except (UserError, ToolError) as exc:
            raise fail(f"cannot open the tools' services: {exc}") from None
        yield


@contextmanager
def _executor_logs(verbose: bool) -> Iterator[None]:
    """Show the executor's log (tracebacks of failing tools) only with ``--verbose``."""
    logger = logging.getLogger("toolrollout")
    handler: logging.Handler
    previous = logger.level
    if verbose:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        logger.setLevel(logging.DEBUG)
    else:
        handler = logging.NullHandler()  # keeps Python's last-resort handler quiet
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)


def _limits_cell(limits: ToolLimits) -> str:
    """One line per limit, as the executor will apply them."""
    retry = limits.retry
    retry_on = [t.__name__ for t in retry.retry_on]
    if retry.retry_timeouts:
        retry_on.append("ToolTimeout")
    breaker = limits.circuit_breaker
    lines = [
        "timeout " + ("none" if limits.timeout is None else f"{limits.timeout:g}s"),
        "concurrency "
        + ("unlimited" if limits.max_concurrency is None else str(limits.max_concurrency)),
        "rate "
        + (
            "unlimited"
            if limits.rate_limit is None
            else f"{limits.rate_limit:g}/s, burst {limits.rate_burst}"
        ),
        "retries "
        + (
            "0"
            if retry.retries == 0
            else f"{retry.retries} on {', '.join(retry_on)} (backoff {retry.initial_backoff:g}s)"
        ),
        "circuit breaker "
        + (
            "none"
            if breaker is None
            else f"open after {breaker.failure_threshold} failures "
            f"({', '.join(t.__name__ for t in breaker.trip_on)}) for {breaker.reset_timeout:g}s"
        ),
    ]
    return "\n".join(lines)


def _parameters_cell(parameters: Mapping[str, Any]) -> str:
    properties = parameters.get("properties") or {}
    required = set(parameters.get("required") or ())
    return ", ".join(f"{name}{'*' if name in required else ''}" for name in properties) or "-"


def list_tools(
    tool_config: ToolConfigOption = None,
    json_only: Annotated[
        bool, typer.Option("--json", help="Print only the JSON schemas (no table).")
    ] = False,
) -> None:
    """Print the tool schemas the model will see, after a table of each tool's limits.

    The JSON is the ``tools=[...]`` list passed to the chat template, in config order. The
    services the tools need are opened and closed first, so a config whose local sandbox
    or retriever cannot start fails here too.
    """
    import anyio

    tools = _load(tool_config)

    async def check() -> None:
        async with _opened(tools):
            pass

    anyio.run(check)  # the services a run would open start (and stop) as they would then
    schemas = [tool.schema() for tool in tools]
    if not json_only:
        from rich.console import Console
        from rich.table import Table

        source = str(tool_config) if tool_config is not None else "built-in calculator"
        table = Table(title=f"{len(tools)} tool(s) from {source}", show_lines=True)
        table.add_column("tool", no_wrap=True)
        table.add_column("parameters (* required)", overflow="fold")
        table.add_column("limits", overflow="fold")
        for tool in tools:
            table.add_row(tool.name, _parameters_cell(tool.parameters), _limits_cell(tool.limits))
        Console().print(table)
    typer.echo(json.dumps(schemas, indent=2, ensure_ascii=False))


def _parse_args(text: str) -> dict[str, Any]:
    from toolrollout._exceptions import UserError
    from toolrollout._jsonarg import json_object

    try:
        return json_object(text, "--args")
    except UserError as exc:
        raise fail(str(exc)) from None


def _print_summary(name: str, result: ToolResult) -> None:
    from rich.console import Console
    from rich.panel import Panel
    from rich.text import Text

    from toolrollout._exceptions import ToolError

    lines = [
        f"status: {'error' if result.is_error else 'ok'}",
        f"error kind: {result.error_kind or ('ToolReportedError' if result.is_error else '-')}",
        f"images: {len(result.images)}",
        f"attempts: {result.attempts}",
        f"seconds: {result.seconds:.3f}",
    ]
    cause = None if result.error is None else result.error.__cause__
    if isinstance(result.error, ToolError) and cause is not None:
        first_line = (str(cause).splitlines() or [""])[0]
        lines.append(f"cause: {type(cause).__name__}: {first_line}".rstrip(": "))
    if result.reward is not None:
        lines.append(f"reward: {result.reward:g}")
    if result.metrics:
        lines.append("metrics: " + json.dumps(dict(result.metrics), sort_keys=True))
    if result.structured is not None:
        lines.append("structured: " + json.dumps(result.structured, default=str)[:200])
    Console(stderr=True).print(
        Panel(Text("\n".join(lines)), title=f"tools call {name}", expand=False)
    )


def call(
    name: Annotated[str, typer.Argument(help="Tool name, as the model would call it.")],
    args: Annotated[
        str, typer.Option("--args", help="Arguments as a JSON object, e.g. '{\"x\": 1}'.")
    ] = "{}",
    tool_config: ToolConfigOption = None,
    ground_truth: Annotated[
        str | None,
        typer.Option(help="The row's reference answer (ToolContext.ground_truth)."),
    ] = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show the executor's log.")
    ] = False,
) -> None:
    """Run one tool call and print the tool message text exactly as the model gets it.

    The text goes to stdout (before the rollout's max_tool_response_tokens cut); a summary
    (status, error kind, images, attempts, seconds) goes to stderr. Exit code 1 when the
    result is an error.
    """
    import anyio

    from toolrollout.tools import ToolCallRequest, ToolContext, ToolExecutor

    arguments = _parse_args(args)
    tools = _load(tool_config)
    executor = ToolExecutor(tools)
    if name not in executor.tools:
        available = ", ".join(executor.tools) or "none"
        raise fail(f"unknown tool {name!r}; available: {available}")
    request = ToolCallRequest(name, arguments)

    async def run() -> ToolResult:
        async with _opened(tools):
            return await executor.run_call(request, ToolContext(ground_truth=ground_truth))

    with _executor_logs(verbose):
        result = anyio.run(run)
    typer.echo(result.text)
    _print_summary(name, result)
    if result.is_error:
        raise typer.Exit(code=1)


tools_app.command("list")(list_tools)
tools_app.command("call")(call)


def register(app: typer.Typer) -> None:
    """Add the ``tools`` command group to the ``toolrollout`` app."""
    app.add_typer(tools_app, name="tools")
