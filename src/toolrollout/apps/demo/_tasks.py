"""What the demo's task modules share: the held-out split by a stable hash, and drawing
tasks with distinct questions."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Literal, TypeVar

__all__ = ["Split", "draw_distinct", "hash_heldout"]

Split = Literal["train", "heldout"]
T = TypeVar("T")


def hash_heldout(salt: str, key: str, percent: int) -> bool:
    """Whether ``key`` is held out: a stable hash of ``salt|key`` falls in ``percent`` %."""
    digest = hashlib.sha256(f"{salt}|{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % 100 < percent


def draw_distinct(
    n: int, draw: Callable[[], T | None], key: Callable[[T], str], what: str
) -> list[T]:
    """The first ``n`` draws with distinct keys (``None``: a draw to skip); an error after
    ``100 * n + 1000`` draws."""
    drawn: dict[str, T] = {}
    attempts = 0
    while len(drawn) < n:
        attempts += 1
        if attempts > 100 * n + 1000:
            raise RuntimeError(f"could not draw {n} distinct {what}")
        item = draw()
        if item is not None:
            drawn.setdefault(key(item), item)
    return list(drawn.values())
