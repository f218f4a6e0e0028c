"""The one parse of a model turn, for the rollout loop and the gateway alike: the parser's
calls, within the family's rules (calls per turn, Mistral's malformed turns, call ids).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from toolrollout.chat import ParsedTurn, TemplateFamily
from toolrollout.chat.parsers import MalformedCall

from ._types import RolloutShared

__all__ = ["parse_model_turn"]


def parse_model_turn(
    shared: RolloutShared,
    turn_ids: Sequence[int],
    calls_so_far: int,
    *,
    forced: Sequence[int] = (),
) -> tuple[str, ParsedTurn]:
    """A model turn's raw text (``forced`` ids first) and its parse under the family's
    rules (call ids numbered after ``calls_so_far``)."""
    chat = shared.chat
    text = chat.model_text((*forced, *turn_ids) if forced else turn_ids)
    family = chat.family
    parsed = _with_family_ids(
        family,
        _runs_nothing_if_malformed(
            family, _within_call_limit(family, shared.parser.parse(text), text)
        ),
        calls_so_far,
    )
    return text, parsed


def _within_call_limit(family: TemplateFamily, parsed: ParsedTurn, text: str) -> ParsedTurn:
    """A turn with more calls than the family's template renders (Llama 3.1/3.2: one)
    becomes one parse error: nothing runs and the turn keeps its raw text as content, so
    no tokens are left that no message renders to."""
    limit = family.max_calls_per_turn
    if limit is None or len(parsed.tool_calls) <= limit or parsed.errors:
        return parsed
    written = len(parsed.tool_calls)
    plural = "call" if limit == 1 else "calls"
    error = MalformedCall(
        message=(
            f"this model's chat template takes at most {limit} tool {plural} per turn; "
            f"{written} were written and none was run"
        ),
        raw=text[:200],
    )
    return dataclasses.replace(parsed, tool_calls=(), errors=(error,))


def _runs_nothing_if_malformed(family: TemplateFamily, parsed: ParsedTurn) -> ParsedTurn:
    """Mistral: a turn with a malformed call runs none of its calls (see feedback_role)."""
    if family.feedback_role != "user" or not parsed.errors or not parsed.tool_calls:
        return parsed
    return dataclasses.replace(parsed, tool_calls=())


def _with_family_ids(family: TemplateFamily, parsed: ParsedTurn, call_number: int) -> ParsedTurn:
    """The turn's calls with the ids the family's template needs (Mistral, Kimi-K2)."""
    if family.call_id is None or not parsed.tool_calls:
        return parsed
    ids = family.make_call_ids(parsed, call_number)
    calls = tuple(
        dataclasses.replace(call, id=call_id)
        for call, call_id in zip(parsed.tool_calls, ids, strict=True)
    )
    return dataclasses.replace(parsed, tool_calls=calls)
