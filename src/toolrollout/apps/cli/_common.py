"""Pieces every ``toolrollout`` command shares: user-error exits and common options.

Kept in one place so that ``generate`` and ``eval`` (which run the same rollouts) describe
their engine and model options identically; what the options mean (the engine factory, the
tokenizer loader, the reward choice) is library code in :mod:`toolrollout.spec`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from toolrollout._security import ADMIN_API_KEY_ENV, API_KEY_ENV, ENGINE_API_KEY_ENV

__all__ = [
    "AdminApiKeyOption",
    "ApiKeyOption",
    "ChatTemplateKwargsOption",
    "EngineApiKeyOption",
    "EngineKindOption",
    "EngineUrlsOption",
    "FamilyOption",
    "InsecureOption",
    "MaxBodyMbOption",
    "MaxRequestsOption",
    "ModelOption",
    "fail",
    "parse_template_kwargs",
    "require_extra",
]

EngineUrlsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--engine-url",
        help="SGLang or vLLM server (repeatable; see --engine). Default: the embedded engine.",
    ),
]
EngineKindOption = Annotated[
    str,
    typer.Option(
        "--engine",
        help="What serves --engine-url: sglang (SGLang, sglang-router, toolrollout serve), "
        "vllm (a vLLM server with --enable-scale-out, docs/engines.md#vllm), or auto: ask "
        "the servers. Servers of different kinds in one run are refused.",
    ),
]
EngineApiKeyOption = Annotated[
    str | None,
    typer.Option(
        "--engine-api-key",
        envvar=ENGINE_API_KEY_ENV,
        show_envvar=True,
        show_default=False,
        help="API key sent as 'Authorization: Bearer' to the --engine-url servers. Prefer "
        "the environment variable: a flag shows in the process list.",
    ),
]
ApiKeyOption = Annotated[
    str | None,
    typer.Option(
        "--api-key",
        envvar=API_KEY_ENV,
        show_envvar=True,
        show_default=False,
        help="Require 'Authorization: Bearer <key>' on every endpoint but health (SGLang's "
        "--api-key). Prefer the environment variable: a flag shows in the process list.",
    ),
]
AdminApiKeyOption = Annotated[
    str | None,
    typer.Option(
        "--admin-api-key",
        envvar=ADMIN_API_KEY_ENV,
        show_envvar=True,
        show_default=False,
        help="Key for the control endpoints (serve: weight updates, pause/continue, flush, "
        "abort; gateway: scoring and closing sessions, and reading every session's), as "
        "SGLang's --admin-api-key; the --api-key then no longer opens them.",
    ),
]
InsecureOption = Annotated[
    bool,
    typer.Option(
        "--insecure",
        help="Serve a non-loopback --host without an API key (anyone who can reach it may "
        "use it). Without a key such a --host is refused.",
    ),
]
MaxBodyMbOption = Annotated[
    float,
    typer.Option("--max-body-mb", min=0.0, help="Largest request body (MiB); larger ones get 413."),
]
MaxRequestsOption = Annotated[
    int,
    typer.Option(
        "--max-requests",
        min=1,
        help="Requests served at once; more get 429 with Retry-After (health not counted).",
    ),
]
# Engine-client options of every command that runs rollouts (generate, eval).
RequestTimeoutOption = Annotated[
    float, typer.Option(min=0.1, help="Seconds to wait for one engine answer.")
]
RetriesOption = Annotated[
    int,
    typer.Option(min=1, help="Attempts per engine request at most (5xx, resets, timeouts)."),
]
RetryBudgetOption = Annotated[
    float,
    typer.Option(
        min=0.0,
        help="Seconds an engine request keeps being retried after its first failure "
        "(rides out a server or router restart).",
    ),
]
FailoverAfterOption = Annotated[
    int,
    typer.Option(
        min=0,
        help="With several --engine-url: failed attempts in a row after which a server's "
        "trajectories move to a healthy one (0: never move).",
    ),
]
ModelOption = Annotated[
    Path | None,
    typer.Option(
        help="Model folder (embedded engine) or tokenizer folder of the served model. "
        "Default: the bundled demo model."
    ),
]

FamilyOption = Annotated[
    str | None,
    typer.Option(
        help="Model family (qwen3, llama3, mistral, glm45, gpt_oss, ...; `toolrollout.chat."
        "template_families()`). Default: detected from the chat template."
    ),
]
ChatTemplateKwargsOption = Annotated[
    str | None,
    typer.Option(
        help="Extra chat-template variables as a JSON object, e.g. '{\"enable_thinking\": false}'."
    ),
]


def parse_template_kwargs(text: str | None) -> dict[str, Any]:
    """``--chat-template-kwargs``: a JSON object, or a one-line :class:`UserError`."""
    from toolrollout._jsonarg import json_object

    return {} if text is None else json_object(text, "--chat-template-kwargs")


def fail(message: str) -> typer.Exit:
    """Print a one-line user error and return the exit (code 2) for the caller to raise."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


def require_extra(extra: str, command: str) -> None:
    """Exit with one line naming ``pip install 'toolrollout[extra]'`` when it is missing."""
    from toolrollout._exceptions import MissingExtraError
    from toolrollout._extras import require_extra as check

    try:
        check(extra, command)
    except MissingExtraError as exc:
        raise fail(str(exc)) from None
