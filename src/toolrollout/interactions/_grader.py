"""Built-in interactions: a grader that tells the model whether it was right."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from toolrollout._exceptions import InteractionError, UserError
from toolrollout.rewards._base import last_assistant_text
from toolrollout.tools._builtin import gsm8k_score

from ._base import Interaction, InteractionReply

__all__ = ["GraderInteraction", "Gsm8kInteraction"]

_STRICT_RE = re.compile(r"#### (-?[0-9.,]+)")


class GraderInteraction(Interaction):
    """Grades each final answer; "correct" ends the trajectory, "wrong" asks for a retry.

    Config keys (all optional): ``max_retries`` (int, default 2; ``null`` for no limit
    other than the rollout's budgets), ``correct_message``, ``retry_message`` and
    ``give_up_message``. The ground truth comes from the row's
    ``interaction_kwargs.ground_truth``, or the row's own ground truth. Each graded turn
    scores 1.0 when right and 0.0 when wrong.
    """

    default_max_retries: int | None = 2

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        retries = self.config.get("max_retries", self.default_max_retries)
        if retries is not None and (
            not isinstance(retries, int) or isinstance(retries, bool) or retries < 0
        ):
            raise UserError(f"max_retries must be a non-negative integer, got {retries!r}")
        self.max_retries: int | None = retries
        self.correct_message = str(self.config.get("correct_message", "Correct."))
        self.retry_message = str(
            self.config.get(
                "retry_message", "That answer is wrong. Check your work and answer again."
            )
        )
        self.give_up_message = str(
            self.config.get("give_up_message", "That answer is wrong. No more attempts.")
        )
        self._instances: dict[str, dict[str, Any]] = {}

    def score(self, answer: str, ground_truth: object) -> float:
        """1.0 when ``answer`` is right: its last number equals the ground truth."""
        return gsm8k_score(answer, ground_truth)

    async def start_interaction(self, instance_id: str | None = None, **kwargs: Any) -> str:
        """Remember the sample's ground truth and count attempts from zero."""
        instance_id = await super().start_interaction(instance_id)
        ground_truth = kwargs.get("ground_truth")
        if ground_truth is None:
            raise InteractionError(
                f"interaction {self.name!r} needs a ground truth: set "
                "extra_info.interaction_kwargs.ground_truth (or the row's answer)"
            )
        self._instances[instance_id] = {"ground_truth": ground_truth, "wrong": 0}
        return instance_id

    async def generate_response(
        self, instance_id: str, messages: Sequence[Mapping[str, Any]], **kwargs: Any
    ) -> InteractionReply:
        """Grade the last assistant message."""
        state = self._instances[instance_id]
        score = self.score(last_assistant_text(messages), state["ground_truth"])
        if score >= 1.0:
            return InteractionReply(
                True, self.correct_message, score, {"attempts": 1 + state["wrong"]}
            )
        state["wrong"] += 1
        if self.max_retries is not None and state["wrong"] > self.max_retries:
            return InteractionReply(True, self.give_up_message, score, {"attempts": state["wrong"]})
        return InteractionReply(False, self.retry_message, score, {"attempts": state["wrong"]})

    async def calculate_score(self, instance_id: str, **kwargs: Any) -> float:
        """1.0 if no wrong answer was given so far, else 0.0."""
        return 1.0 if self._instances[instance_id]["wrong"] == 0 else 0.0

    async def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        """Drop the trajectory's state."""
        self._instances.pop(instance_id, None)


class Gsm8kInteraction(GraderInteraction):
    """The grader with verl's strict GSM8K format (only ``#### <number>`` counts) and, as
    in verl, unlimited retries by default."""

    default_max_retries = None

    def score(self, answer: str, ground_truth: object) -> float:
        """1.0 when the last ``#### <number>`` in ``answer`` equals the ground truth."""
        found = _STRICT_RE.findall(answer)
        if not found:
            return 0.0
        return gsm8k_score(found[-1], ground_truth)
