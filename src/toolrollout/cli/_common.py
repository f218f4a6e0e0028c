"""Pieces every ``toolrollout`` command shares: user-error exits and common options.

Kept in one place so that ``generate`` and ``eval`` (which run the same rollouts) describe
their engine and model options identically; what the options mean (the engine factory, the
tokenizer loader, the reward choice) is library code in :mod:`toolrollout.spec`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = ["EngineUrlsOption", "ModelOption", "fail", "require_extra"]

EngineUrlsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--engine-url",
        help="SGLang-compatible server (repeatable). Default: the embedded engine.",
    ),
]
ModelOption = Annotated[
    Path | None,
    typer.Option(
        help="Model folder (embedded engine) or tokenizer folder of the served model. "
        "Default: the bundled demo model."
    ),
]


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
