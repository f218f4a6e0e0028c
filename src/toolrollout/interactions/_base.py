"""The interaction seam: what answers the model when it ends a turn without a tool call.

The method names and shapes are verl's ``BaseInteraction`` (``start_interaction``,
``generate_response`` returning ``(done, message, turn_score, metrics)``,
``calculate_score``, ``finalize_interaction``), so verl interaction classes run unchanged.
"""

from __future__ import annotations

import math
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from toolrollout._exceptions import InteractionError

__all__ = ["Interaction", "InteractionReply"]


@dataclass(frozen=True, slots=True)
class InteractionReply:
    """One answer of an interaction to a finished model turn."""

    done: bool
    """True ends the trajectory (the message is then not appended)."""
    message: str = ""
    """The user/environment message appended when the conversation goes on."""
    reward: float | None = None
    """The score of the model turn just answered (recorded in ``turn_rewards``)."""
    metrics: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def coerce(cls, value: object) -> InteractionReply:
        """Accept an :class:`InteractionReply` or verl's ``(done, message, score, metrics)``."""
        if isinstance(value, InteractionReply):
            return value
        if isinstance(value, tuple) and len(value) in (2, 3, 4):
            done, message, *rest = value
            reward = rest[0] if rest else None
            metrics = rest[1] if len(rest) > 1 else {}
            if not isinstance(message, str):
                raise InteractionError(
                    f"an interaction message must be a string, got {type(message).__name__}"
                )
            if reward is not None:
                try:
                    reward = float(reward)
                except (TypeError, ValueError) as exc:
                    raise InteractionError(
                        f"an interaction turn score must be a number, got {reward!r}"
                    ) from exc
                if math.isnan(reward):
                    raise InteractionError("an interaction returned a NaN turn score")
            return cls(bool(done), message, reward, dict(metrics or {}))
        raise InteractionError(
            "generate_response must return an InteractionReply or a "
            f"(done, message, score, metrics) tuple, got {type(value).__name__}"
        )


class Interaction(ABC):
    """A simulated user or environment that answers the model's final turns.

    One object serves every trajectory that names it; per-trajectory state is kept by
    ``instance_id`` (the trajectory's uid). Subclasses implement :meth:`generate_response`.
    """

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        self.config: dict[str, Any] = dict(config or {})
        self.name: str = str(self.config.get("name", type(self).__name__))

    async def start_interaction(self, instance_id: str | None = None, **kwargs: Any) -> str:
        """Begin a trajectory; ``kwargs`` are the row's ``interaction_kwargs``."""
        return instance_id if instance_id is not None else uuid.uuid4().hex

    @abstractmethod
    async def generate_response(
        self, instance_id: str, messages: Sequence[Mapping[str, Any]], **kwargs: Any
    ) -> InteractionReply | tuple[bool, str, float | None, dict[str, Any]]:
        """Answer the conversation so far (it ends with the model's turn)."""

    async def calculate_score(self, instance_id: str, **kwargs: Any) -> float:
        """A trajectory-level score, for interactions that keep one (verl's hook)."""
        return 0.0

    async def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        """End a trajectory and drop its state. Called once per started trajectory."""
        return None
