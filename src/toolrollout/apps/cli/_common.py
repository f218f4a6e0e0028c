"""Pieces every ``toolrollout`` command shares: user-error exits and missing extras.

The options the commands share are declared in :mod:`._options`.
"""

from __future__ import annotations

from typing import Any

import typer

__all__ = ["fail", "parse_template_kwargs", "require_extra"]


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
