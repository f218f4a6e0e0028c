"""When a trajectory's transcript is compared with a fresh render (the drift check).

Rendering and tokenizing the whole conversation after every turn makes a turn's cost grow
with the conversation. Instead each tool or interaction delta only records a checkpoint
(three lengths, O(1)), and the render runs at the last checkpoint when the trajectory ends
(plus every ``RolloutConfig.drift_check_every``-th checkpoint, if set). A transcript is
append-only, so when a check finds drift, the checkpoints not yet checked are replayed and
the reports come out exactly as a check after every turn would have written them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolrollout.chat import check_drift

if TYPE_CHECKING:
    from ._loop import RolloutServices, _State

__all__ = ["drift_checkpoint", "final_drift_check"]


def drift_checkpoint(services: RolloutServices, state: _State) -> None:
    """Record the state after a tool or interaction delta; check it now if it is due."""
    config = services.config
    if not config.drift_check:
        return
    state.drift_checkpoints.append(
        (len(state.prompt_ids) + state.response_len, len(state.messages), len(state.model_texts))
    )
    every = config.drift_check_every
    number = len(state.drift_checkpoints)
    if every is not None and number % every == 0:
        if not _check(services, state, number - 1):
            _replay(services, state)


def final_drift_check(services: RolloutServices, state: _State) -> None:
    """At the end (or the abort) of a trajectory: check the last checkpoint, if unchecked."""
    if not state.drift_checkpoints:
        return
    last = len(state.drift_checkpoints) - 1
    if last not in state.drift_checked and not _check(services, state, last):
        _replay(services, state)


def _replay(services: RolloutServices, state: _State) -> None:
    """Drift was found: check every checkpoint not checked yet, so no report is missing."""
    for index in range(len(state.drift_checkpoints)):
        if index not in state.drift_checked:
            _check(services, state, index)


def _check(services: RolloutServices, state: _State, index: int) -> bool:
    """Compare the transcript with a fresh render as it was at checkpoint ``index``."""
    transcript_len, messages_len, turns = state.drift_checkpoints[index]
    transcript = state.transcript()[:transcript_len]
    if services.vision is not None:  # compare with one placeholder per image, as rendered
        transcript = services.vision.collapse(transcript)
    report = check_drift(
        transcript,
        state.messages[:messages_len],
        chat_format=services.chat,
        model_texts=state.model_texts[:turns],
    )
    state.drift_checked.add(index)
    if not report.matches:
        state.drift_found[index] = report.to_dict()
    return report.matches
