"""Kimi-K2 tool calls: a section of ``<|tool_call_begin|>ID<|tool_call_argument_begin|>{...}``.

The syntax follows SGLang's ``kimi_k2`` detector: the id is ``functions.NAME:IDX`` (a bare
``NAME:IDX`` is accepted), the name is read from it, and the id is kept verbatim because
Kimi's chat template writes it back. Unlike SGLang, a call this parser cannot read is
reported, not dropped, and an unterminated call or section is an error.
"""

from __future__ import annotations

import re

from ._base import (
    CallCollector,
    ParsedTurn,
    SectionCallParser,
    call_from_json,
    join_content,
)

__all__ = ["KimiK2Parser"]

_ID = re.compile(r"(?:functions\.)?(?P<name>[\w.\-]+):(?P<index>\d+)")


class KimiK2Parser(SectionCallParser):
    """``<|tool_calls_section_begin|>`` … ``<|tool_calls_section_end|>`` with JSON arguments."""

    name = "kimi_k2"
    section_open = "<|tool_calls_section_begin|>"
    section_close = "<|tool_calls_section_end|>"
    call_open = "<|tool_call_begin|>"
    call_markers = (section_open, call_open)
    call_close = "<|tool_call_end|>"
    argument_open = "<|tool_call_argument_begin|>"
    text_between_calls_is_error = True

    def _named_head(self, name: str) -> str:
        return f"functions.{name}:"

    def parse_body(self, text: str) -> ParsedTurn:
        """Parse the call section; text before and after it is content."""
        collector = CallCollector(self)
        start = text.find(self.section_open)
        if start == -1:
            stray = text.find(self.call_open)
            if stray == -1:
                return collector.turn(text.strip())
            collector.error(f"a tool call outside {self.section_open}", text[stray:])
            return collector.turn(text[:stray].strip())
        body_start = start + len(self.section_open)
        end = text.find(self.section_close, body_start)
        if end == -1:
            collector.error(
                f"unterminated tool-call section: missing {self.section_close}", text[start:]
            )
            return collector.turn(text[:start].strip())
        self._parse_section(text[body_start:end], collector)
        trailing = text[end + len(self.section_close) :]
        return collector.turn(join_content([text[:start], trailing]))

    def _parse_call(self, inner: str, collector: CallCollector) -> None:
        if self.argument_open not in inner:
            collector.error(f"the tool call has no {self.argument_open}", inner)
            return
        head, payload = inner.split(self.argument_open, 1)
        call_id = head.strip()
        match = _ID.fullmatch(call_id)
        if match is None:
            collector.error(
                f"the tool-call id {call_id!r} is not of the form functions.NAME:INDEX", inner
            )
            return
        collector.add(call_from_json(payload.strip(), match.group("name"), inner), call_id)
