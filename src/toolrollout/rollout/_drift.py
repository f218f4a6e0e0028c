"""When a trajectory's transcript is compared with a fresh render (the drift check).

Each environment delta records a checkpoint (three lengths, O(1)); the render runs at the
end, and when it finds drift the unchecked checkpoints are replayed, so the reports are
those of a check after every turn (docs/rollouts.md, Drift check). The ledger is handed what
it compares (a :class:`DriftView`), so it needs nothing from the loop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from toolrollout.chat import ChatFormat, VisionFormat, check_drift

__all__ = ["DriftLedger", "DriftView"]

_DOCUMENTED_KINDS = frozenset({"history_rewrite"})
"""Drift a model family documents (its template re-renders earlier turns differently): the
transcript is right, so it is reported but not counted as a mismatch."""


@dataclass(frozen=True, slots=True)
class DriftView:
    """The transcript as it is now, and how to render it."""

    chat: ChatFormat
    vision: VisionFormat | None
    transcript: Sequence[int]
    messages: Sequence[dict[str, Any]]
    model_texts: Sequence[str]


@dataclass(slots=True)
class DriftLedger:
    """The checkpoints of one trajectory and what checking them found."""

    checkpoints: list[tuple[int, int, int]] = field(default_factory=list)
    """(transcript length, message count, model turns) after each environment delta."""
    checked: set[int] = field(default_factory=set)
    found: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Report of each checked checkpoint that did not match, by checkpoint index."""

    def reports(self) -> list[dict[str, Any]]:
        return [self.found[i] for i in sorted(self.found)]

    def mismatches(self) -> int:
        """Checkpoints whose drift is not a documented rewrite (``drift_mismatches``)."""
        return sum(1 for report in self.found.values() if report["kind"] not in _DOCUMENTED_KINDS)

    def expected(self) -> int:
        """Checkpoints that differ only by the family's documented rewrite (``drift_expected``)."""
        return sum(1 for report in self.found.values() if report["kind"] in _DOCUMENTED_KINDS)

    def checkpoint(
        self, lengths: tuple[int, int, int], every: int | None, view: Callable[[], DriftView]
    ) -> None:
        """Record ``lengths`` (transcript, messages, model turns) after an environment
        delta, in O(1); render ``view()`` and check it now only if the check is due."""
        self.checkpoints.append(lengths)
        number = len(self.checkpoints)
        if every is not None and number % every == 0:
            now = view()
            if not self._check(now, number - 1):
                self._replay(now)

    def final_check(self, view: DriftView) -> None:
        """At the end (or the abort) of a trajectory: check the last checkpoint, if unchecked."""
        if not self.checkpoints:
            return
        last = len(self.checkpoints) - 1
        if last not in self.checked and not self._check(view, last):
            self._replay(view)

    def _replay(self, view: DriftView) -> None:
        """Drift was found: check every checkpoint not checked yet, so no report is missing."""
        for index in range(len(self.checkpoints)):
            if index not in self.checked:
                self._check(view, index)

    def _check(self, view: DriftView, index: int) -> bool:
        """Compare the transcript with a fresh render as it was at checkpoint ``index``."""
        transcript_len, messages_len, turns = self.checkpoints[index]
        transcript = list(view.transcript[:transcript_len])
        if view.vision is not None:  # compare with one placeholder per image, as rendered
            transcript = view.vision.collapse(transcript)
        report = check_drift(
            transcript,
            list(view.messages[:messages_len]),
            chat_format=view.chat,
            model_texts=list(view.model_texts[:turns]),
        )
        self.checked.add(index)
        if not report.matches:
            self.found[index] = report.to_dict()
        # A documented rewrite needs no replay of the earlier checkpoints.
        return report.matches or report.kind in _DOCUMENTED_KINDS
