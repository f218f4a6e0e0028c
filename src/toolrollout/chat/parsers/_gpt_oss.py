r"""gpt-oss (harmony) output: channels, and tool calls addressed to ``functions.NAME``.

A harmony turn is a run of messages, ``<|start|>ROLE<|channel|>CHANNEL<|message|>BODY``
closed by ``<|end|>``, ``<|call|>`` or ``<|return|>``; the first one's ``<|start|>assistant``
is the generation prompt's. ``analysis`` is the reasoning; ``commentary`` addressed
``to=functions.NAME`` (in the channel part as the model writes it, or in the role part as
the template renders it) with a JSON body is a tool call; ``commentary`` without a
recipient and ``final`` are content.

SGLang's ``gpt-oss`` detector reads the same syntax. Differences, on purpose: a call that
cannot be accepted is a :class:`MalformedCall` (SGLang drops it); ``functions.`` is the only
namespace taken off a recipient (SGLang would run ``browser.search`` as a function tool
``search``); text is kept verbatim, because the template writes it back as it is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ._base import (
    CallCollector,
    MalformedCall,
    ParsedTurn,
    ToolCallParser,
    call_from_json,
    clip,
)

__all__ = [
    "GptOssParser",
    "HarmonyMessage",
    "HarmonyTurn",
    "is_call",
    "read_call",
    "split_harmony",
    "tool_name",
]

START = "<|start|>"
CHANNEL = "<|channel|>"
MESSAGE = "<|message|>"
CONSTRAIN = "<|constrain|>"
END = "<|end|>"
CALL = "<|call|>"
RETURN = "<|return|>"

FUNCTIONS_NAMESPACE = "functions."
"""The namespace of user-defined (function) tools; built-ins are ``browser.*`` and ``python``."""

_TERMINATOR = re.compile("|".join(re.escape(marker) for marker in (END, CALL, RETURN, CHANNEL)))
_RECIPIENT = re.compile(r"\bto=(\S*)")


@dataclass(frozen=True, slots=True)
class HarmonyMessage:
    """One harmony message of a model turn, as written (nothing stripped)."""

    channel: str | None
    """``analysis``, ``commentary``, ``final`` (or whatever the model wrote); None if absent."""
    recipient: str | None
    """The ``to=`` target (``functions.add``); None for messages to no one in particular."""
    content_type: str | None
    """``json`` from ``<|constrain|>json`` or a bare word after the channel; None if absent."""
    body: str
    """Text between ``<|message|>`` and the terminator."""
    terminator: str | None
    """``<|end|>``, ``<|call|>``, ``<|return|>``; None when the text ended first or a
    ``<|channel|>`` closed the message implicitly."""
    complete: bool
    """False when the header never reached ``<|message|>`` (then ``body`` is empty)."""
    raw: str
    """The message's text, header included (for error records and plain-text fallbacks)."""


@dataclass(frozen=True, slots=True)
class HarmonyTurn:
    """A model turn split into messages, plus text that belongs to no message."""

    messages: tuple[HarmonyMessage, ...]
    stray: tuple[str, ...]
    """Text outside any message, e.g. a reply without harmony markup, in order."""


def split_harmony(text: str) -> HarmonyTurn:
    """Split one model turn (the generation after ``<|start|>assistant``) into messages.

    Never raises. A ``<|channel|>`` inside a body closes the message implicitly (the model
    skipped ``<|end|><|start|>assistant``), as in SGLang's harmony parser. Text with no
    harmony markup, e.g. a plain reply or words after a terminator, is stray text.
    """
    messages: list[HarmonyMessage] = []
    stray: list[str] = []
    for segment in text.split(START):
        rest = segment
        while rest:
            if MESSAGE not in rest and CHANNEL not in rest:
                stray.append(rest)
                break
            message, rest = _next_message(rest)
            messages.append(message)
    return HarmonyTurn(tuple(messages), tuple(stray))


def _next_message(text: str) -> tuple[HarmonyMessage, str]:
    """The message at the start of ``text``, and the text after it."""
    header, has_message, after = text.partition(MESSAGE)
    parts = _read_header(header)
    if not has_message:
        return HarmonyMessage(*parts, "", None, False, text), ""
    match = _TERMINATOR.search(after)
    if match is None:
        return HarmonyMessage(*parts, after, None, True, text), ""
    implicit = match.group() == CHANNEL  # implicit close: the next message starts here
    rest = after[match.start() if implicit else match.end() :]
    terminator = None if implicit else match.group()
    raw = text[: len(text) - len(rest)]
    return HarmonyMessage(*parts, after[: match.start()], terminator, True, raw), rest


def _read_header(header: str) -> tuple[str | None, str | None, str | None]:
    """``ROLE[ to=R]<|channel|>CHANNEL[ to=R][ <|constrain|>TYPE | TYPE]`` -> parts."""
    role_part, has_channel, channel_part = header.partition(CHANNEL)
    recipient = _recipient(role_part)
    if not has_channel:
        return None, recipient, None
    channel_part, has_constrain, constrain = channel_part.partition(CONSTRAIN)
    words = _RECIPIENT.sub(" ", channel_part).split()
    recipient = _recipient(channel_part) or recipient
    channel = words[0] if words else None
    content_type = constrain.strip() if has_constrain else (words[1] if len(words) > 1 else None)
    return channel, recipient, content_type or None


def _recipient(text: str) -> str | None:
    match = _RECIPIENT.search(text)
    if match is None:
        return None
    return match.group(1) or None


def tool_name(recipient: str) -> str:
    """The function tool a recipient names: ``functions.add`` -> ``add``; others unchanged."""
    return recipient.removeprefix(FUNCTIONS_NAMESPACE)


def join_parts(parts: list[str]) -> str:
    """Join message bodies verbatim; several are separated by a blank line."""
    return "\n\n".join(parts)


def is_call(message: HarmonyMessage) -> bool:
    """Whether a message is a tool call (addressed, or a commentary with a content type)."""
    return message.recipient is not None or (
        message.channel == "commentary" and message.content_type is not None
    )


def read_call(message: HarmonyMessage) -> tuple[str, dict[str, Any]] | MalformedCall:
    """Validate one call message: ``(tool name, arguments)`` or why it is malformed."""
    if message.recipient is None:
        return MalformedCall(
            f"a {message.content_type} commentary message has no recipient; "
            "address tool calls with to=functions.NAME",
            clip(message.raw),
        )
    name = tool_name(message.recipient)
    problem: str | None = None
    if not name:
        problem = f"the recipient {message.recipient!r} names no tool"
    elif not message.complete:
        problem = f"the call to {name!r} has no {MESSAGE}: the arguments never started"
    elif message.content_type not in (None, "json"):
        problem = (
            f"the call to {name!r} has content type {message.content_type!r}; "
            "function tools take <|constrain|>json"
        )
    elif message.terminator not in (None, CALL):
        problem = f"the call to {name!r} ends with {message.terminator}, not {CALL}"
    if problem is not None:
        return MalformedCall(problem, clip(message.raw))
    body = message.body.strip()
    return call_from_json(body, name, body) if body else (name, {})


class GptOssParser(ToolCallParser):
    """Harmony channels: analysis -> reasoning, commentary ``to=functions.X`` -> calls."""

    name = "gpt-oss"
    splits_think_tags = False

    def parse_body(self, text: str) -> ParsedTurn:
        """Walk the turn's messages; reasoning, content and calls come from their channels."""
        collector = CallCollector(self)
        turn = split_harmony(text)
        reasoning: list[str] = []
        content: list[str] = []
        for message in turn.messages:
            if is_call(message):
                collector.add(read_call(message))
            elif not message.complete:
                content.append(message.raw)  # a header cut off before <|message|>
            elif message.channel == "analysis":
                reasoning.append(message.body)
            else:
                content.append(message.body)
        content.extend(part for part in turn.stray if part.strip())
        return ParsedTurn(
            content=join_parts(content),
            tool_calls=tuple(collector.calls),
            errors=tuple(collector.errors),
            reasoning=join_parts(reasoning) if reasoning else None,
        )
