"""JSON objects given as text (command-line options, environment variables), checked once."""

from __future__ import annotations

import json
from typing import Any

from ._exceptions import UserError

__all__ = ["json_object"]


def json_object(text: str, what: str) -> dict[str, Any]:
    """``text`` as a JSON object, or a one-line :class:`UserError` naming ``what``."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{what} is not valid JSON: {exc.msg} at position {exc.pos}") from None
    if not isinstance(value, dict):
        raise UserError(f"{what} must be a JSON object, got {type(value).__name__}")
    return value
