"""The stream events of a finished turn, for the translation tests."""

from __future__ import annotations

from typing import Any

from toolrollout.apps.gateway._sse import StreamWriter
from toolrollout.apps.gateway._types import ChatResult, StreamDelta


def turn_events(writer: StreamWriter, result: ChatResult) -> list[dict[str, Any]]:
    """The events of ``result`` with its reasoning and content each in one delta."""
    choice = result.choices[0]
    events = writer.begin()
    if choice.reasoning:
        events += writer.delta(StreamDelta("reasoning", choice.reasoning))
    if choice.content:
        events += writer.delta(StreamDelta("content", choice.content))
    return events + writer.finish(result)
