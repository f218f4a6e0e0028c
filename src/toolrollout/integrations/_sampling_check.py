"""The sampling a trainer assumes must be the sampling the engine does.

TRL recomputes every completion's logprobs at ``args.temperature``; a rollout sampled
otherwise is scored against a distribution it was not drawn from, and nothing in the loss
shows it. So a difference is refused before the first rollout.
"""

from __future__ import annotations

import math
from typing import Any

from toolrollout._exceptions import UserError
from toolrollout.engines._types import SamplingParams

__all__ = ["check_sampling"]


def _off_if_nonpositive(value: Any) -> float | None:
    """top-k / min-p: 0, a negative number or None all mean "no filter"."""
    return None if value is None or float(value) <= 0 else float(value)


def check_sampling(sampling: SamplingParams, args: Any) -> None:
    """Raise :class:`UserError` when ``sampling`` and the trainer's ``args`` disagree (on
    the fields ``args`` has)."""
    if args is None:
        return
    ours: dict[str, float | None] = {
        "temperature": float(sampling.temperature),
        "top_p": float(sampling.top_p),
        "top_k": _off_if_nonpositive(sampling.top_k),
        "min_p": _off_if_nonpositive(sampling.min_p),
    }
    problems: list[str] = []
    for name, mine in ours.items():
        if not hasattr(args, name):
            continue
        raw = getattr(args, name)
        theirs = _off_if_nonpositive(raw) if name in ("top_k", "min_p") else raw
        if theirs is None and mine is None:
            continue
        if theirs is None or mine is None or not math.isclose(mine, float(theirs), rel_tol=1e-6):
            problems.append(
                f"SamplingParams.{name}={_show(getattr(sampling, name))} but the trainer's "
                f"args.{name}={_show(raw)}"
            )
    if problems:
        raise UserError(
            "sampling mismatch: "
            + "; ".join(problems)
            + " (the trainer scores completions with its own values; set them equal)"
        )


def _show(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else repr(value)
