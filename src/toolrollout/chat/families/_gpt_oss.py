r"""gpt-oss: the harmony format (channels analysis / commentary / final).

What the official template (``openai/gpt-oss-*`` ``chat_template.jinja``) does, and what
this family does about it:

- The model stops at ``<|call|>`` (after one tool call) or ``<|return|>`` (after the final
  answer); nothing follows either (boundary ``""``). The template renders only
  ``tool_calls[0]``, so a turn with more calls is one parse error.
- A delta follows the conversation rendered as history (``delta_after_history``): once a
  user turn follows a final answer, the template writes that answer with ``<|end|>`` and
  without its analysis, so counting stop tokens would not find where the answer ends.
- Messages carry the analysis in ``thinking``, the final channel in ``content`` and one
  ``commentary`` call in ``tool_calls`` (arguments as an object). A call turn keeps all its
  text in ``thinking``, because the template refuses both fields there; the raw text
  cannot be content (channel markup is refused), so ``drift_from_raw_text=False``.
- History rewrites (:func:`harmony_history`): the analysis of every turn before a later
  final answer, and of every final answer that is not the last message, is dropped;
  ``<|return|>`` becomes ``<|end|>`` in history; a call header is spelled
  ``<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>`` where the
  model writes the recipient after the channel and ``<|constrain|>json``, with ``tojson``
  spacing; the system message's date may change between renders. A malformed call's raw
  arguments, which the template can only write JSON-quoted, are read back unquoted.
- A tool result is named after the latest call, so an error answer to a malformed call
  needs a call on the assistant turn: the malformed call is kept there with its
  recipient's name and its raw arguments as a string.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..parsers._base import call_entry
from ..parsers._gpt_oss import (
    CALL,
    CHANNEL,
    CONSTRAIN,
    END,
    MESSAGE,
    RETURN,
    START,
    is_call,
    join_parts,
    read_call,
    split_harmony,
    tool_name,
)
from ._family import TemplateFamily, TemplateProbe, rendered_arguments

if TYPE_CHECKING:
    from ..parsers import ParsedTurn

__all__ = ["FAMILIES", "GPT_OSS", "detect_harmony", "harmony_assistant_message", "harmony_history"]

_E = re.escape
_START, _CHANNEL, _MESSAGE, _END = _E(START), _E(CHANNEL), _E(MESSAGE), _E(END)
_ASSISTANT_HEADER = re.compile(
    f"{_START}assistant([^<]*){_CHANNEL}([^<]*)(?:{_E(CONSTRAIN)}([^<]*))?{_MESSAGE}"
)
_ANALYSIS = re.compile(
    f"{_START}assistant{_CHANNEL}analysis{_MESSAGE}(?:(?!{_START}|{_END}).)*{_END}", re.DOTALL
)
_CALL_BODY = re.compile(
    f"({_START}assistant to=[^<]*{_CHANNEL}[^<]*{_MESSAGE})((?:(?!{_START}).)*?){_E(CALL)}",
    re.DOTALL,
)
_DATE = re.compile(r"(Current date: )\d{4}-\d{2}-\d{2}")
_RECIPIENT = re.compile(r"\bto=(\S*)")


def _canonical_header(match: re.Match[str]) -> str:
    """One spelling of an assistant header: the recipient in the role part, ``json``."""
    role_part, channel_part, constrain = match.group(1), match.group(2), match.group(3)
    recipient_match = _RECIPIENT.search(channel_part) or _RECIPIENT.search(role_part)
    words = _RECIPIENT.sub(" ", channel_part).split()
    channel = words[0] if words else ""
    if recipient_match is None:
        return f"{START}assistant{CHANNEL}{channel}{MESSAGE}"
    content_type = (constrain or "").strip() or (words[1] if len(words) > 1 else "json")
    recipient = recipient_match.group(1)
    return f"{START}assistant to={recipient}{CHANNEL}{channel} {content_type}{MESSAGE}"


def _canonical_arguments(match: re.Match[str]) -> str:
    """A call's JSON arguments in one spacing (unchanged when they are not JSON); a quoted
    string whose text is not JSON (a malformed call's raw arguments) is read back as that
    text. A double-encoded object stays quoted, so it still differs."""
    try:
        value = json.loads(match.group(2))
    except ValueError:
        return match.group(0)
    if isinstance(value, str) and not _is_json(value):
        return match.group(1) + value + CALL
    return match.group(1) + json.dumps(value, ensure_ascii=False) + CALL


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def harmony_history(text: str) -> str:
    """Map a rendered or sampled harmony text to the form in which re-render rewrites vanish.

    ``<|return|>`` becomes ``<|end|>``, analysis messages go, call headers and call
    arguments get one spelling, and the system message's date is masked (see the module
    docstring for why each is expected).
    """
    text = text.replace(RETURN, END)
    text = _ASSISTANT_HEADER.sub(_canonical_header, text)
    text = _ANALYSIS.sub("", text)
    text = _CALL_BODY.sub(_canonical_arguments, text)
    return _DATE.sub(r"\g<1>YYYY-MM-DD", text)


def harmony_assistant_message(
    text: str, parsed: ParsedTurn, family: TemplateFamily, call_ids: Sequence[str]
) -> dict[str, Any]:
    """The assistant message the official template re-renders a harmony turn from (the
    fields and the malformed-call rule are in the module docstring)."""
    calls: list[dict[str, Any]] = []
    accepted = iter(zip(parsed.tool_calls, call_ids, strict=True))
    for message in split_harmony(text).messages:
        if not is_call(message):
            continue
        read = read_call(message)
        if isinstance(read, tuple):
            # Accepted unless the turn broke the family's call limit (then none runs).
            call, call_id = next(accepted, (None, f"not_run_{len(calls)}"))
            name, arguments = (call.name, call.arguments) if call is not None else read
            calls.append(call_entry(call_id, name, rendered_arguments(arguments, family)))
        else:
            name = tool_name(message.recipient or "")
            calls.append(call_entry(f"malformed_{len(calls)}", name, message.body))
    message_out: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if calls:
        thinking = [] if parsed.reasoning is None else [parsed.reasoning]
        thinking += [parsed.content] if parsed.content else []
        message_out["content"] = ""
        if thinking:
            message_out["thinking"] = join_parts(thinking)
        message_out["tool_calls"] = calls
    elif parsed.reasoning is not None:
        message_out["thinking"] = parsed.reasoning
    message_out["raw_content"] = text
    return message_out


def detect_harmony(probe: TemplateProbe) -> bool:
    """A harmony template: the probe's call renders on the commentary channel, ending ``<|call|>``.

    Without a render (the probe failed), the template text must write the same markers.
    """
    if probe.rendered is not None:
        return CALL in probe.rendered and f"{CHANNEL}commentary" in probe.rendered
    return CALL in probe.template and f"{CHANNEL}commentary" in probe.template


GPT_OSS = TemplateFamily(
    name="gpt_oss",
    stop_tokens=(RETURN, CALL),
    boundary="",
    generation_prompt=f"{START}assistant",
    tool_parser="gpt-oss",
    rewrites_history=True,
    history_normalizer=harmony_history,
    description="gpt-oss (harmony): analysis/commentary/final channels, one call per turn "
    "on the commentary channel to=functions.NAME, tool results from functions.NAME.",
    detect=detect_harmony,
    detect_priority=30,
    delta_after_history=True,
    max_calls_per_turn=1,
    arguments_as="object",
    reasoning_field="thinking",
    assistant_message=harmony_assistant_message,
    drift_from_raw_text=False,
    parallel_calls=False,
)

FAMILIES: tuple[TemplateFamily, ...] = (GPT_OSS,)
