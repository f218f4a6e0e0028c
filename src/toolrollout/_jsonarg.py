"""JSON objects given as text (command-line options, environment variables), in a file, or
in JSON Lines files, checked once."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ._exceptions import UserError

__all__ = ["json_file_object", "json_object", "jsonl_objects"]


def json_object(text: str, what: str) -> dict[str, Any]:
    """``text`` as a JSON object, or a one-line :class:`UserError` naming ``what``."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{what} is not valid JSON: {exc.msg} at position {exc.pos}") from None
    if not isinstance(value, dict):
        raise UserError(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def json_file_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in the UTF-8 file ``path``; None when it is unreadable or not one."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def jsonl_objects(
    lines: Iterable[bytes], where: str, error: type[UserError] = UserError
) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for each non-blank line of a JSON Lines file; a line that is
    not UTF-8 or not a JSON object raises ``error`` naming ``where:line``."""
    for number, raw in enumerate(lines, start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise error(
                f"{where}:{number}: not UTF-8 text (bad byte at column {exc.start + 1})"
            ) from exc
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise error(f"{where}:{number}: invalid JSON ({exc.msg})") from exc
        except RecursionError as exc:
            raise error(f"{where}:{number}: JSON nested too deeply") from exc
        if not isinstance(row, dict):
            raise error(f"{where}:{number}: expected a JSON object, got {type(row).__name__}")
        yield number, row
