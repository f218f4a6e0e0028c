"""Parsers for the JSON-based tool-call formats (hermes/Qwen, Llama 3, Mistral, DeepSeek).

The syntax of each format follows SGLang's detectors (``python/sglang/srt/function_call``)
so that a trajectory parses the same way the serving stack would, with two deliberate
differences: malformed calls are reported instead of silently dropped, and an unterminated
call is an error rather than accepted (an RL reward should not depend on lenient parsing).
"""

from __future__ import annotations

import json
import re

from ._base import (
    WHITESPACE,
    CallCollector,
    ParsedTurn,
    SectionCallParser,
    TaggedCallParser,
    ToolCallParser,
    call_from_json,
    call_from_object,
    join_content,
    loads,
    not_an_object,
    raw_decode,
    skip_whitespace,
)

__all__ = [
    "DeepSeekV3Parser",
    "HermesParser",
    "Llama3JsonParser",
    "MistralParser",
]


class HermesParser(TaggedCallParser):
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, repeated (Qwen2.5/3).

    Whitespace inside the tags is free (Qwen writes a newline on both sides). A tag may
    also hold a JSON list of calls, as SGLang's hermes detector allows.
    """

    name = "hermes"

    def forced_call_prefix(self, name: str | None = None) -> str | None:
        if name is None:
            return "<tool_call>\n"
        return f'<tool_call>\n{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": '

    def _parse_block(self, block: str, collector: CallCollector) -> None:
        value, error = loads(block.strip())
        if error is not None:
            collector.error(f"{error} inside {self.open_tag}", block)
        else:
            collector.add_object(value, block)


class Llama3JsonParser(ToolCallParser):
    """Llama 3.1/3.2 JSON calls: ``<|python_tag|>{...}`` or a bare ``{...}`` turn.

    Calls are ``{"name": ..., "parameters": {...}}`` (``arguments`` is accepted too),
    several separated by ``;``. Without ``<|python_tag|>``, a turn is a call only when it
    starts with a JSON object that has a ``name`` key, so plain JSON answers stay content.
    """

    name = "llama3"
    tag = "<|python_tag|>"
    separator = ";"
    call_markers = ("<|python_tag|>", "{", "[")

    def forced_call_prefix(self, name: str | None = None) -> str | None:
        if name is None:
            return '{"name": "'
        return f'{{"name": {json.dumps(name, ensure_ascii=False)}, "parameters": '

    def parse_body(self, text: str) -> ParsedTurn:
        """Decode the call sequence after the tag (or at the start of the turn)."""
        collector = CallCollector(self)
        if self.tag in text:
            before, action = text.split(self.tag, 1)
            tagged = True
        else:
            before, action, tagged = "", text, False
            start = skip_whitespace(action, 0)
            if not action.startswith(("{", "["), start):
                return collector.turn(text.strip())
            value, _, error = raw_decode(action, start)
            if error is not None:
                if not re.match(r'\{\s*"name"\s*:', action[start:]):
                    return collector.turn(text.strip())
            elif not _looks_like_call(value):
                return collector.turn(text.strip())
        trailing = self._parse_sequence(action, collector, tagged)
        return collector.turn(join_content([before, trailing]))

    def _parse_sequence(self, action: str, collector: CallCollector, tagged: bool) -> str:
        """Decode ``obj ; obj ; ...``; return the text left after the last call."""
        index = skip_whitespace(action, 0)
        if tagged and index >= len(action):
            collector.error(f"{self.tag} is not followed by a tool call", action)
            return ""
        while index < len(action):
            value, end, error = raw_decode(action, index)
            if error is not None:
                collector.error(f"{error} in the tool call", action[index:])
                return ""
            collector.add_object(value, action[index:end])
            index = skip_whitespace(action, end)
            if action.startswith(self.separator, index):
                index = skip_whitespace(action, index + len(self.separator))
                continue
            return action[index:]
        return ""


def _looks_like_call(value: object) -> bool:
    if isinstance(value, dict):
        return "name" in value
    if isinstance(value, list):
        return bool(value) and all(isinstance(v, dict) and "name" in v for v in value)
    return False


class MistralParser(ToolCallParser):
    """Mistral: ``[TOOL_CALLS] [{...}, ...]`` (Nemo, Small 3.1) or, one marker per call,
    ``[TOOL_CALLS]name[CALL_ID]id[ARGS]{...}`` (Small 3.2, the id optional). A call id the
    model wrote is kept; it must be nine letters or digits, as the templates require.
    """

    name = "mistral"
    marker = "[TOOL_CALLS]"
    call_markers = ("[TOOL_CALLS]",)
    args_marker = "[ARGS]"
    id_marker = "[CALL_ID]"

    def parse_body(self, text: str) -> ParsedTurn:
        """Walk each ``[TOOL_CALLS]`` section in order."""
        collector = CallCollector(self)
        first = text.find(self.marker)
        if first == -1:
            return collector.turn(text.strip())
        segments = [text[:first]]
        position = first
        while position != -1:
            index = skip_whitespace(text, position + len(self.marker))
            if text.startswith(("[", "{"), index):
                end = self._parse_json_section(text, index, collector)
            else:
                end = self._parse_compact_section(text, index, collector)
            if end is None:
                break
            following = text.find(self.marker, end)
            segments.append(text[end:] if following == -1 else text[end:following])
            position = following
        return collector.turn(join_content(segments))

    def forced_call_prefix(self, name: str | None = None) -> str | None:
        return self.marker if name is None else None  # the call's form varies by version

    def _parse_json_section(self, text: str, index: int, collector: CallCollector) -> int | None:
        value, end, error = raw_decode(text, index)
        if error is not None:
            collector.error(f"{error} after {self.marker}", text[index:])
            return None
        raw = text[index:end]
        if isinstance(value, list) and value:
            for element in value:
                self._add_json_call(element, raw, collector)
        else:
            collector.add_object(value, raw)
        return end

    def _add_json_call(self, obj: object, raw: str, collector: CallCollector) -> None:
        """One element of the JSON list, keeping the ``"id"`` the model wrote."""
        model_id = obj.get("id", "") if isinstance(obj, dict) else ""
        if model_id and (problem := _call_id_problem(model_id)):
            collector.error(problem, raw)
            return
        collector.add(call_from_object(obj, raw), model_id if isinstance(model_id, str) else "")

    def _parse_compact_section(self, text: str, index: int, collector: CallCollector) -> int | None:
        args_at = text.find(self.args_marker, index)
        next_marker = text.find(self.marker, index)
        if args_at == -1 or (next_marker != -1 and next_marker < args_at):
            collector.error(
                f"expected {self.marker} followed by a JSON list or name{self.args_marker}{{...}}",
                text[index:] if next_marker == -1 else text[index:next_marker],
            )
            return None if next_marker == -1 else next_marker
        head = text[index:args_at]
        json_at = skip_whitespace(text, args_at + len(self.args_marker))
        call_id = ""
        if self.id_marker in head:
            head, call_id = head.split(self.id_marker, 1)
            call_id = call_id.strip()
            if problem := _call_id_problem(call_id):
                collector.error(problem, text[index:json_at])
                return None
        name = head.strip()
        if not name or any(ch in WHITESPACE for ch in name):
            collector.error(
                f"invalid tool name {name!r} before {self.args_marker}", text[index:json_at]
            )
            return None
        value, end, error = raw_decode(text, json_at)
        if error is not None:
            collector.error(f"{error} in the arguments of the call to {name!r}", text[json_at:])
            return None
        if not isinstance(value, dict):
            collector.add(not_an_object(name, value, text[index:end]))
            return end
        collector.add((name, value), call_id)
        return end


_MISTRAL_CALL_ID = re.compile(r"[A-Za-z0-9]{9}")


def _call_id_problem(call_id: object) -> str | None:
    if isinstance(call_id, str) and _MISTRAL_CALL_ID.fullmatch(call_id):
        return None
    return f"the call id {call_id!r} must be exactly 9 letters or digits"


class DeepSeekV3Parser(SectionCallParser):
    """DeepSeek-V3: ``<｜tool▁calls▁begin｜>`` sections with a ```json fence per call.

    Each call: ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```
    <｜tool▁call▁end｜>``; the section ends with ``<｜tool▁calls▁end｜>``.
    """

    name = "deepseekv3"
    section_open = "<｜tool▁calls▁begin｜>"
    section_close = "<｜tool▁calls▁end｜>"
    call_open = "<｜tool▁call▁begin｜>"
    call_close = "<｜tool▁call▁end｜>"
    separator = "<｜tool▁sep｜>"
    call_markers = (section_open, call_open)

    fenced = True

    _FENCE = re.compile(r"\A\s*```(?:json)?[ \t]*\n?(.*?)\n?```\s*\Z", re.DOTALL)

    def _named_head(self, name: str) -> str:
        return f"function{self.separator}{name}\n```json\n"

    def parse_body(self, text: str) -> ParsedTurn:
        """Parse every call between the section markers."""
        collector = CallCollector(self)
        start = text.find(self.section_open)
        if start == -1:
            start = text.find(self.call_open)
            if start == -1:
                return collector.turn(text.strip())
            body_start = start
        else:
            body_start = start + len(self.section_open)
        end = text.find(self.section_close, body_start)
        body = text[body_start:] if end == -1 else text[body_start:end]
        trailing = "" if end == -1 else text[end + len(self.section_close) :]
        self._parse_section(body, collector)
        return collector.turn(join_content([text[:start], trailing]))

    def _parse_call(self, inner: str, collector: CallCollector) -> None:
        if self.separator not in inner:
            collector.error(f"the tool call has no {self.separator}", inner)
            return
        head, rest = inner.split(self.separator, 1)
        if self.fenced:
            name, newline, arguments = rest.partition("\n")
            match = self._FENCE.match(arguments) if newline else None
            if match is None:
                collector.error("the arguments must follow the name in a ```json fence", inner)
                return
            payload = match.group(1)
        else:
            name, payload = head, rest
        name = name.strip()
        if not name:
            collector.error("the tool call has no name", inner)
            return
        collector.add(call_from_json(payload.strip(), name, inner))


class DeepSeekV31Parser(DeepSeekV3Parser):
    """DeepSeek-V3.1: like V3 but ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}``, no fence."""

    name = "deepseekv31"
    fenced = False

    def _named_head(self, name: str) -> str:
        return f"{name}{self.separator}"
