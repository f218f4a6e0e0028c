"""Drift check: compare a token transcript with a fresh render of its messages.

The transcript is authoritative (it holds what the model saw and sampled), so the check
only *reports*: template or tokenizer problems show up in metrics instead of as a crash
hours into a run (verifiers #115, prime-rl #1334). The kinds of drift, from ``none`` (a
token-exact match) to ``render_error``, are explained in docs/rollouts.md#drift-check.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from .._exceptions import TokenizationError, UserError
from ._format import ChatFormat, Message
from .families import TemplateFamily

__all__ = ["DriftKind", "DriftReport", "check_drift"]

DriftKind = Literal["none", "history_rewrite", "retokenization", "text", "render_error"]

_ASSISTANT_STRUCTURE_KEYS = frozenset({"tool_calls", "reasoning_content", "function_call"})


@dataclass(frozen=True, slots=True)
class DriftReport:
    """Outcome of :func:`check_drift`; JSON-ready through :meth:`to_dict`."""

    matches: bool
    """True when the transcript ids equal the fresh render's ids exactly."""
    kind: DriftKind
    """Classification of the difference (see docs/rollouts.md#drift-check)."""
    text_matches: bool
    """True when both sides decode to the same text."""
    first_mismatch: int | None
    """Token index of the first differing id (or the shorter length); None on a match."""
    first_text_mismatch: int | None
    """Character offset of the first differing character; None when the texts match."""
    transcript_length: int
    """Number of ids in the transcript."""
    reference_length: int
    """Number of ids in the fresh render (0 on a render error)."""
    transcript_excerpt: str
    """Decoded transcript tokens around the first mismatch ('' on a match)."""
    reference_excerpt: str
    """Decoded fresh-render tokens around the first mismatch ('' on a match)."""
    detail: str
    """One human-readable sentence."""

    @property
    def expected(self) -> bool:
        """True for drift that does not indicate a bug (none, history rewrite, retokenization)."""
        return self.kind in ("none", "history_rewrite", "retokenization")

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form for recording on a trajectory."""
        return asdict(self)


def check_drift(
    transcript_ids: Sequence[int],
    messages: Sequence[Message],
    *,
    chat_format: ChatFormat,
    model_texts: Sequence[str] | None = None,
    context_tokens: int = 12,
) -> DriftReport:
    """Compare ``transcript_ids`` with a fresh render of ``messages``; never alters tokens.

    Args:
        transcript_ids: the trajectory's full token sequence (prompt, verbatim model
            turns, tool deltas). Only read.
        messages: the conversation the transcript represents.
        chat_format: the format the transcript was built with.
        model_texts: the raw text of each model turn, in order (e.g. from
            :meth:`ChatFormat.model_text`): the last assistant turns, since earlier ones
            may have come in the prompt. When given, each of those assistant messages is
            rendered from its raw text instead of its parsed ``tool_calls``, so the check
            is about the template and the tokenizer, not about JSON spacing. A trailing
            stop token in a text is ignored.
        context_tokens: how many tokens each excerpt shows on either side of the mismatch.

    The fresh render ends like the transcript does: with the generation prompt when the
    last message is not an assistant turn, and right after the stop token (without the
    template's boundary) when it is.
    """
    transcript = list(transcript_ids)
    if not chat_format.family.drift_from_raw_text:
        model_texts = None  # raw text is not valid content for this format (harmony)
    reference_messages = _with_model_texts(messages, model_texts, chat_format)
    try:
        reference_text = _reference_text(reference_messages, chat_format, transcript)
    except TokenizationError as exc:
        return _unlocated("render_error", len(transcript), 0, str(exc))
    reference = chat_format.encode(reference_text)
    if transcript == reference:
        detail = "the transcript equals a fresh render token for token"
        return _unlocated("none", len(transcript), len(reference), detail)
    return _mismatch(chat_format, transcript, reference, reference_text, context_tokens)


def _unlocated(
    kind: DriftKind, transcript_length: int, reference_length: int, detail: str
) -> DriftReport:
    """A report with no mismatch position: a match (``none``) or a ``render_error``."""
    return DriftReport(
        matches=kind == "none",
        kind=kind,
        text_matches=kind == "none",
        first_mismatch=None,
        first_text_mismatch=None,
        transcript_length=transcript_length,
        reference_length=reference_length,
        transcript_excerpt="",
        reference_excerpt="",
        detail=detail,
    )


def _mismatch(
    chat_format: ChatFormat,
    transcript: list[int],
    reference: list[int],
    reference_text: str,
    context_tokens: int,
) -> DriftReport:
    """The report for ids that differ: where, and what kind of drift it is."""
    position = _first_difference(transcript, reference)
    start = max(0, position - context_tokens)
    stop = position + context_tokens
    transcript_text = chat_format.decode(transcript)
    text_position = _first_difference(transcript_text, reference_text)
    text_matches = transcript_text == reference_text
    kind, detail = _classify(
        chat_format.family, transcript_text, reference_text, position, text_position
    )
    return DriftReport(
        matches=False,
        kind=kind,
        text_matches=text_matches,
        first_mismatch=position,
        first_text_mismatch=None if text_matches else text_position,
        transcript_length=len(transcript),
        reference_length=len(reference),
        transcript_excerpt=chat_format.decode(transcript[start:stop]),
        reference_excerpt=chat_format.decode(reference[start:stop]),
        detail=detail,
    )


def _classify(
    family: TemplateFamily,
    transcript_text: str,
    reference_text: str,
    position: int,
    text_position: int,
) -> tuple[DriftKind, str]:
    """What kind of drift a mismatch at token ``position`` is, and a sentence saying so."""
    if transcript_text == reference_text:
        return "retokenization", (
            f"same text, different ids from token {position}: the model's tokens are not "
            "the canonical tokenization of its text (kept as sampled)"
        )
    normalize = family.history_normalizer
    if normalize is not None and normalize(transcript_text) == normalize(reference_text):
        return "history_rewrite", (
            f"the texts differ only by the history rewrite of family {family.name!r} "
            f"(first difference at token {position}); expected, the transcript keeps what "
            "the model saw"
        )
    return "text", (
        f"the transcript text differs from a fresh render at character {text_position} "
        f"(token {position}); check the template family and the turn boundaries"
    )


def _with_model_texts(
    messages: Sequence[Message], model_texts: Sequence[str] | None, chat_format: ChatFormat
) -> list[dict[str, Any]]:
    """Copy ``messages``, replacing each assistant turn by its raw model text."""
    copies = [dict(message) for message in messages]
    if model_texts is None:
        return copies
    assistant_positions = [i for i, m in enumerate(copies) if m.get("role") == "assistant"]
    if len(assistant_positions) < len(model_texts):
        raise UserError(
            f"model_texts has {len(model_texts)} entries but messages has "
            f"{len(assistant_positions)} assistant turns"
        )
    # The texts are the last turns': assistant messages before them came in the prompt
    # (a few-shot example, a harness's earlier conversation) and render as they are.
    generated = assistant_positions[len(assistant_positions) - len(model_texts) :]
    for position, text in zip(generated, model_texts, strict=True):
        message = {
            key: value
            for key, value in copies[position].items()
            if key not in _ASSISTANT_STRUCTURE_KEYS
        }
        message["content"] = chat_format.strip_stop(text)
        copies[position] = message
    return copies


def _reference_text(
    messages: Sequence[Message], chat_format: ChatFormat, transcript: Sequence[int]
) -> str:
    """Fresh render, cut to end where a transcript of these messages ends."""
    if messages and messages[-1].get("role") == "assistant":
        text = chat_format.render_text(messages, add_generation_prompt=False)
        family = chat_format.family
        if family.stop_opens_next_turn and chat_format.ends_with_stop(transcript):
            # The template writes this token only as the next turn's opener; the model
            # sampled it, so the transcript ends with it.
            return text + chat_format.decode(transcript[-1:])
        boundary = family.boundary
        if boundary and text.endswith(boundary):
            text = text[: -len(boundary)]
        return text
    return chat_format.render_text(messages, add_generation_prompt=True)


def _first_difference(left: Sequence[Any], right: Sequence[Any]) -> int:
    """Index of the first differing element, or the shorter length if one is a prefix."""
    for index, (a, b) in enumerate(zip(left, right, strict=False)):
        if a != b:
            return index
    return min(len(left), len(right))
