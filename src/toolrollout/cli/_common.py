"""Pieces every ``toolrollout`` command shares: user-error exits, common options, loaders.

Kept in one place so that ``generate`` and ``eval`` (which run the same rollouts) describe
and validate their engine and model options identically.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

__all__ = ["EngineUrlsOption", "ModelOption", "fail", "is_number", "load_tokenizer"]

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


def load_tokenizer(path: Path) -> Any:
    """The tokenizer of a model folder, or a one-line :class:`UserError` saying why not."""
    from transformers import AutoTokenizer

    from toolrollout._exceptions import UserError

    if not path.is_dir():
        raise UserError(f"model folder not found: {path}")
    try:
        return AutoTokenizer.from_pretrained(str(path))
    except Exception as exc:  # transformers raises many types for a bad folder
        raise UserError(f"cannot load a tokenizer from {path}: {exc}") from exc


def is_number(value: object) -> bool:
    """Whether a ground truth reads as a number (then answers are scored numerically)."""
    try:
        float(str(value).replace(",", ""))
    except ValueError:
        return False
    return True
