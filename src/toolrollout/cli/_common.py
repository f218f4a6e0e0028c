"""Pieces every ``toolrollout`` command shares: user-error exits, common options, loaders.

Kept in one place so that ``generate`` and ``eval`` (which run the same rollouts) describe
and validate their engine and model options identically.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from toolrollout.engines import Engine

__all__ = [
    "EngineUrlsOption",
    "ModelOption",
    "fail",
    "is_number",
    "load_tokenizer",
    "require_extra",
    "start_engine",
]

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


def load_tokenizer(path: Path) -> Any:
    """The tokenizer of a model folder, or a one-line :class:`UserError` saying why not."""
    from toolrollout._exceptions import UserError
    from toolrollout._extras import require_extra as check

    check("cli", "loading a tokenizer from a model folder", "transformers")
    from transformers import AutoTokenizer

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


async def start_engine(
    engine_urls: list[str] | None,
    model_path: Path,
    *,
    threads: int | None,
    health_timeout: float,
    **client_options: Any,
) -> tuple[Engine, int | None]:
    """The servers at ``engine_urls`` (once healthy), or the embedded engine on ``model_path``.

    Returns the engine and its context length (``None`` when a server does not report one).
    ``client_options`` go to :class:`~toolrollout.engines.SGLangClient`.
    """
    if engine_urls:
        from toolrollout.engines import SGLangClient

        client = SGLangClient(engine_urls, **client_options)
        await client.wait_healthy(timeout=health_timeout)
        raw = (await client.server_info()).get("context_length")
        return client, int(raw) if isinstance(raw, int) else None
    from toolrollout.engines import EmbeddedEngine

    embedded = EmbeddedEngine(model_path, num_threads=threads)
    await embedded.start()
    return embedded, embedded.context_length
