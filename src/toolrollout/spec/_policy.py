"""Loading a model folder's tokenizer, with a one-line error when it cannot be."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from toolrollout._exceptions import UserError

__all__ = ["load_tokenizer"]


def load_tokenizer(path: str | Path) -> Any:
    """The tokenizer of a model folder, or a one-line :class:`UserError` saying why not."""
    from toolrollout._extras import require_extra

    require_extra("cli", "loading a tokenizer from a model folder", "transformers")
    from transformers import AutoTokenizer

    folder = Path(path)
    if not folder.is_dir():
        raise UserError(f"model folder not found: {folder}")
    try:
        return AutoTokenizer.from_pretrained(str(folder))
    except Exception as exc:  # transformers raises many types for a bad folder
        raise UserError(f"cannot load a tokenizer from {folder}: {exc}") from exc
