"""GLM-4.5 / GLM-4.6 tool calls: ``<tool_call>NAME`` with ``<arg_key>``/``<arg_value>`` pairs.

The syntax follows SGLang's ``glm45`` detector. Values carry no type of their own: the
official template writes a string argument raw and every other value as JSON, and this
parser inverts exactly that by the tool's schema (``string`` parameters keep their text,
other values are decoded as JSON when they decode). Unlike SGLang, it does not unquote a
JSON string literal (the template never writes those quotes), and a call it cannot read
(no closing tag, a key without a value, stray text between pairs, a repeated key) is a
reported error, not skipped or read loosely.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._base import WHITESPACE, CallCollector, ParsedTurn, TaggedCallParser, loads, skip_whitespace

__all__ = ["Glm45Parser"]

_STOPS = ("<|observation|>", "<|user|>", "<|endoftext|>")


class Glm45Parser(TaggedCallParser):
    """``<tool_call>NAME\\n<arg_key>k</arg_key>\\n<arg_value>v</arg_value>\\n</tool_call>``."""

    name = "glm45"
    key_open, key_close = "<arg_key>", "</arg_key>"
    value_open, value_close = "<arg_value>", "</arg_value>"

    def forced_call_prefix(self, name: str | None = None) -> str | None:
        return self.open_tag if name is None else f"{self.open_tag}{name}\n"

    def parse_body(self, text: str) -> ParsedTurn:
        """Collect every ``<tool_call>`` block; text outside them is content."""
        for stop in _STOPS:  # GLM stops at the token that opens the next turn
            if text.endswith(stop):
                text = text[: -len(stop)]
                break
        return super().parse_body(text)

    def _parse_block(self, inner: str, collector: CallCollector) -> None:
        first_key = inner.find(self.key_open)
        head = inner if first_key == -1 else inner[:first_key]
        name = head.strip()
        if not name or any(ch in WHITESPACE or ch in "<\\" for ch in name):
            collector.error(f"invalid tool name {name!r} after {self.open_tag}", inner)
            return
        arguments: dict[str, Any] = {}
        position = len(head)
        while True:
            position = skip_whitespace(inner, position)
            if position >= len(inner):
                break
            pair = self._read_pair(inner, position)
            if isinstance(pair, str):
                collector.error(f"{pair} in the call to {name!r}", inner)
                return
            key, raw, position = pair
            if key in arguments:
                collector.error(f"argument {key!r} is given twice in the call to {name!r}", inner)
                return
            arguments[key] = self._value(name, key, raw)
        collector.add((name, arguments))

    def _read_pair(self, inner: str, position: int) -> tuple[str, str, int] | str:
        """Read ``<arg_key>k</arg_key> <arg_value>v</arg_value>`` at ``position``."""
        key = _tagged(inner, position, self.key_open, self.key_close, "")
        if isinstance(key, str):
            return key
        name = key[0].strip()
        if not name:
            return "an empty argument name"
        value_at = skip_whitespace(inner, key[1])
        value = _tagged(
            inner, value_at, self.value_open, self.value_close, f" for argument {name!r}"
        )
        return value if isinstance(value, str) else (name, value[0], value[1])

    def _value(self, tool: str, key: str, raw: str) -> Any:
        """The typed value: raw text for string parameters, else JSON when it decodes."""
        if _schema_type(self._properties(tool).get(key)) == "string":
            return raw
        value, error = loads(raw)
        return raw if error is not None else value


def _tagged(inner: str, at: int, open_: str, close: str, where: str) -> tuple[str, int] | str:
    """The text between ``open_`` (at ``at``) and the next ``close``, and the position after
    ``close``; else what is wrong, ending with ``where``."""
    if not inner.startswith(open_, at):
        return f"expected {open_}{where}, found {inner[at : at + 20]!r}"
    start = at + len(open_)
    end = inner.find(close, start)
    if end == -1:
        return f"{open_} without {close}{where}"
    return inner[start:end], end + len(close)


def _schema_type(schema: Any) -> str | None:
    """The JSON-schema ``type`` of a property when it is a single plain type."""
    if not isinstance(schema, Mapping):
        return None
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        kind = kinds[0] if len(kinds) == 1 else None
    if kind is None and "enum" in schema:
        values = schema["enum"]
        if isinstance(values, list) and values and all(isinstance(v, str) for v in values):
            return "string"
    return kind if isinstance(kind, str) else None
