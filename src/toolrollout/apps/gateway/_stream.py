"""What a streamed model turn may show before it is parsed: the safe text of a partial turn.

:class:`TurnStream` sends only text that is a prefix of what the parsed turn will say,
holding back anything that may still become a tool call, a think tag or an end-of-turn
token; :meth:`TurnStream.finish` returns the rest once the turn is parsed. See the
"Streaming" section of docs/gateway.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from toolrollout.chat.parsers._base import END_OF_TURN_STRINGS

from ._types import StreamDelta

__all__ = ["IncrementalText", "TurnStream"]

_REPLACEMENT = "\ufffd"


class TurnStream:
    """The safe deltas of one turn as its text grows (see the module docstring).

    ``markers``: the parser's call markers (None: unknown, hold all content). ``think``:
    the reasoning delimiters when the parser splits them, else None. ``thinking``: the
    generation prompt opened a reasoning block, so the turn starts inside it.
    """

    def __init__(
        self,
        *,
        markers: tuple[str, ...] | None,
        think: tuple[str, str] | None,
        thinking: bool,
        stops: tuple[str, ...] = (),
    ) -> None:
        self._markers = markers
        self._think = think
        self._thinking = thinking
        held = (*(markers or ()), *(think or ()), *END_OF_TURN_STRINGS, *stops)
        self._holds = tuple(m for m in held if m)
        self.reasoning = ""
        """The reasoning sent so far."""
        self.content = ""
        """The content sent so far."""
        self.last: list[StreamDelta] = []
        """What :meth:`finish` returned (the gateway sends it after the parse)."""

    def feed(self, text: str) -> list[StreamDelta]:
        """The new deltas for the turn's text so far (the whole decoded text each time)."""
        reasoning, content = self._split(text.rstrip(_REPLACEMENT))
        out: list[StreamDelta] = []
        if reasoning is not None:
            out += self._advance("reasoning", self._safe(reasoning.lstrip(), cut_markers=False))
        if content is not None and self._markers is not None:
            out += self._advance("content", self._safe(content.lstrip(), cut_markers=True))
        return out

    def finish(self, reasoning: str | None, content: str) -> list[StreamDelta]:
        """The rest of the parsed turn (what was not sent yet, when it continues what was)."""
        return [*self._advance("reasoning", reasoning or ""), *self._advance("content", content)]

    def _advance(self, kind: Literal["reasoning", "content"], text: str) -> list[StreamDelta]:
        """The delta to ``text`` when it continues what was sent of ``kind``."""
        sent = self.reasoning if kind == "reasoning" else self.content
        if text == sent or not text.startswith(sent):
            return []
        setattr(self, kind, text)
        return [StreamDelta(kind, text[len(sent) :])]

    def _split(self, text: str) -> tuple[str | None, str | None]:
        """(reasoning so far or None, content so far or None: undecided)."""
        if self._think is None:
            return None, text
        opener, closer = self._think
        close = text.find(closer)
        stripped = text.lstrip()
        if self._thinking:
            if close == -1:
                return text, None
            return text[:close], text[close + len(closer) :]
        if stripped.startswith(opener):
            inner = stripped[len(opener) :]
            close = inner.find(closer)
            if close == -1:
                return inner, None
            return inner[:close], inner[close + len(closer) :]
        if opener.startswith(stripped):
            return None, None  # may still become a think block
        return None, text

    def _safe(self, text: str, *, cut_markers: bool) -> str:
        """``text`` up to the first marker, less a tail that may grow into a held string."""
        if cut_markers:
            for marker in (*(self._markers or ()), *(self._think or ())):
                at = text.find(marker)
                if at != -1:
                    text = text[:at]
        for size in range(min(len(text), max((len(h) for h in self._holds), default=0)), 0, -1):
            tail = text[-size:]
            if any(h.startswith(tail) for h in self._holds):
                text = text[:-size]
                break
        return text.rstrip()


class IncrementalText:
    """A turn's text as its ids grow, decoding only the new ids each time (decoding all ids
    after every token would cost O(n^2) on a long turn).

    The new ids are decoded together with the few before them, and the text they add is
    taken as the difference, so tokenizers whose pieces depend on what precedes them (a
    SentencePiece word-start space) still join up; a piece that ends in an incomplete
    UTF-8 character waits for the next id. The parse at the end decodes the whole turn.
    """

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0
        self.text = ""

    def extend(self, ids: Sequence[int]) -> str:
        """Add ids; the whole text so far."""
        self._ids.extend(ids)
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        if len(after) > len(before) and not after.endswith(_REPLACEMENT):
            self.text += after[len(before) :]
            self._prefix, self._read = self._read, len(self._ids)
        return self.text
