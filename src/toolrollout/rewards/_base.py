"""Reward functions: plain callables over a finished trajectory.

A reward function receives the whole :class:`~toolrollout.rollout.Trajectory` (messages with
tool calls and tool results, the ground truth, counters) and returns a float. Sync and async
functions are both accepted. The rollout loop scores each finished trajectory with
:func:`evaluate_terms`; an exception there (or a NaN) ends the trajectory ``failed`` with
``finish_reason="reward_error"`` and keeps the error: a broken reward never becomes a
silent 0.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from toolrollout._records import Trajectory

__all__ = [
    "RewardFunction",
    "WeightedReward",
    "combine",
    "exact_match",
    "final_answer_text",
    "last_assistant_text",
    "numeric_match",
    "tool_error_penalty",
]

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


class RewardFunction(Protocol):
    """Anything callable on a trajectory that returns a float (or awaits one)."""

    def __call__(self, trajectory: Trajectory, /) -> float | Awaitable[float]: ...


def final_answer_text(trajectory: Trajectory) -> str:
    """The content of the last assistant message (empty if there is none)."""
    return last_assistant_text(trajectory.messages)


def last_assistant_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The content of the last assistant message of ``messages`` (empty if there is none)."""
    for message in reversed(messages):
        if message.get("role") == "assistant":
            content = message.get("content")
            return content if isinstance(content, str) else ""
    return ""


def _last_number(text: str) -> float | None:
    matches = _NUMBER.findall(text.replace(",", ""))
    return float(matches[-1]) if matches else None


def exact_match(trajectory: Trajectory) -> float:
    """1.0 when the final answer, stripped, equals the ground truth string."""
    if trajectory.ground_truth is None:
        raise ValueError("exact_match needs a ground truth on the trajectory")
    answer = final_answer_text(trajectory).strip()
    truth = str(trajectory.ground_truth).strip()
    return 1.0 if answer == truth or answer.rstrip(".") == truth else 0.0


def numeric_match(trajectory: Trajectory, *, rel_tol: float = 1e-6) -> float:
    """1.0 when the last number in the final answer equals the numeric ground truth."""
    if trajectory.ground_truth is None:
        raise ValueError("numeric_match needs a ground truth on the trajectory")
    truth = _last_number(str(trajectory.ground_truth))
    if truth is None:
        raise ValueError(f"ground truth {trajectory.ground_truth!r} is not a number")
    answer = _last_number(final_answer_text(trajectory))
    if answer is None:
        return 0.0
    return 1.0 if math.isclose(answer, truth, rel_tol=rel_tol, abs_tol=1e-9) else 0.0


def tool_error_penalty(per_error: float = 0.1) -> Callable[[Trajectory], float]:
    """Shaping term: minus ``per_error`` for each failed or malformed tool call."""

    def penalty(trajectory: Trajectory) -> float:
        return -per_error * (trajectory.tool_errors + trajectory.parse_errors)

    penalty.__name__ = "tool_error_penalty"
    return penalty


@dataclass(frozen=True, slots=True)
class WeightedReward:
    """A reward function with its weight and the name its value is reported under."""

    name: str
    function: Callable[[Trajectory], Any]
    weight: float = 1.0


def combine(
    *functions: Callable[[Trajectory], Any] | WeightedReward,
) -> list[WeightedReward]:
    """Normalise reward functions into named, weighted terms that are summed."""
    terms: list[WeightedReward] = []
    for fn in functions:
        if isinstance(fn, WeightedReward):
            terms.append(fn)
        else:
            terms.append(WeightedReward(getattr(fn, "__name__", type(fn).__name__), fn))
    names = [t.name for t in terms]
    if len(set(names)) != len(names):
        raise ValueError(f"reward terms need distinct names, got {names}")
    return terms


async def evaluate_terms(
    terms: Sequence[WeightedReward], trajectory: Trajectory
) -> tuple[float, dict[str, float]]:
    """Return the weighted sum and each term's raw value; exceptions propagate."""
    details: dict[str, float] = {}
    total = 0.0
    for term in terms:
        value = term.function(trajectory)
        if inspect.isawaitable(value):
            value = await value
        value = float(value)
        if math.isnan(value):
            raise ValueError(f"reward {term.name!r} returned NaN")
        details[term.name] = value
        total += term.weight * value
    return total, details
