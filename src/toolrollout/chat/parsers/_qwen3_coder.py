"""Qwen3-Coder's XML tool calls, with arguments typed by the tool's JSON schema.

The official template writes ``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nvalue\\n
</parameter>\\n</function>\\n</tool_call>``; the syntax follows SGLang's ``qwen3_coder``
detector. A value is raw text (one newline on each side belongs to the markup), so it is
converted by the type its tool declares for it, as SGLang does; a value that does not
convert stays a string, so the tool's own argument check reports it to the model.

Stricter than SGLang on purpose (an RL reward should not depend on lenient parsing): an
unterminated tag, text inside ``<tool_call>`` that is not a function block, or a function
block outside ``<tool_call>`` is a malformed call; a boolean that is neither ``true`` nor
``false`` stays a string; values are never evaluated as Python literals.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ._base import (
    CallCollector,
    MalformedCall,
    TaggedCallParser,
    clip,
    loads,
)

__all__ = ["Qwen3CoderParser"]

_CALL_OPEN = "<tool_call>"
_CALL_CLOSE = "</tool_call>"
_FUNCTION_CLOSE = "</function>"
_PARAMETER_CLOSE = "</parameter>"
_FUNCTION_OPEN = re.compile(r"<function=([^>\n]*)>")
_PARAMETER_OPEN = re.compile(r"<parameter=([^>\n]*)>")
_INTEGER = re.compile(r"[-+]?\d+")
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")

_STRING_TYPES = frozenset({"string", "str", "text", "varchar", "char", "enum"})
_INTEGER_PREFIXES = ("int", "uint", "long", "short", "unsigned")
_NUMBER_PREFIXES = ("num", "float")
_BOOLEAN_TYPES = frozenset({"boolean", "bool", "binary"})


class Qwen3CoderParser(TaggedCallParser):
    """``<tool_call><function=NAME><parameter=KEY>value</parameter>...</function></tool_call>``,
    repeated for parallel calls; a block may hold several function blocks (as in SGLang)."""

    name = "qwen3_coder"
    call_markers = ("<tool_call>", "<function=")

    def forced_call_prefix(self, name: str | None = None) -> str | None:
        return "<tool_call>\n" if name is None else f"<tool_call>\n<function={name}>\n"

    def _outside(self, segment: str, collector: CallCollector) -> str:
        """Content between blocks; a function block there is a call without its wrapper."""
        if _FUNCTION_OPEN.search(segment):
            collector.error(
                f"a <function=...> block must be inside {_CALL_OPEN}{_CALL_CLOSE}", segment
            )
            return ""
        return segment

    def _parse_block(self, block: str, collector: CallCollector) -> None:
        """One ``<tool_call>`` body: one or more function blocks and whitespace."""
        position = 0
        found = False
        while True:
            match = _FUNCTION_OPEN.search(block, position)
            if match is None:
                rest = block[position:]
                if rest.strip() or not found:
                    collector.error(
                        f"expected <function=NAME>...{_FUNCTION_CLOSE} inside {_CALL_OPEN}",
                        block,
                    )
                return
            if block[position : match.start()].strip():
                collector.error(f"unexpected text before <function=...> inside {_CALL_OPEN}", block)
                return
            end = block.find(_FUNCTION_CLOSE, match.end())
            if end == -1:
                collector.error(
                    f"unterminated <function={match.group(1)}>: it must end with {_FUNCTION_CLOSE}",
                    block[match.start() :],
                )
                return
            collector.add(self._parse_function(match.group(1), block[match.end() : end]))
            found = True
            position = end + len(_FUNCTION_CLOSE)

    def _parse_function(
        self, raw_name: str, body: str
    ) -> tuple[str, dict[str, Any]] | MalformedCall:
        """Name and typed arguments of one function block, or a MalformedCall."""
        name = raw_name.strip()
        arguments = (
            self._arguments(name, body) if name else "the <function=...> tag has no tool name"
        )
        if isinstance(arguments, str):
            return MalformedCall(arguments, clip(f"<function={raw_name}>{body}{_FUNCTION_CLOSE}"))
        return name, arguments

    def _arguments(self, name: str, body: str) -> dict[str, Any] | str:
        """The typed arguments of a call to ``name``, or why they cannot be read."""
        schema = self._properties(name)
        arguments: dict[str, Any] = {}
        position = 0
        while True:
            match = _PARAMETER_OPEN.search(body, position)
            if match is None:
                if body[position:].strip():
                    return (
                        f"unexpected text in the call to {name!r}: only "
                        f"<parameter=KEY>...{_PARAMETER_CLOSE} blocks may appear there"
                    )
                return arguments
            if body[position : match.start()].strip():
                return f"unexpected text before a parameter of the call to {name!r}"
            key = match.group(1).strip()
            end = body.find(_PARAMETER_CLOSE, match.end())
            if end == -1:
                return (
                    f"parameter {key!r} of the call to {name!r} is not closed with "
                    + _PARAMETER_CLOSE
                )
            if not key:
                return f"a <parameter=...> tag of the call to {name!r} has no name"
            if key in arguments:
                return f"parameter {key!r} appears twice in the call to {name!r}"
            value = body[match.end() : end]
            value = value.removeprefix("\n").removesuffix("\n")
            arguments[key] = _convert(value, schema.get(key))
            position = end + len(_PARAMETER_CLOSE)


def _schema_type(schema: Any) -> str:
    """The declared type of one property, lower-cased; ``string`` when none is given."""
    if not isinstance(schema, Mapping) or "type" not in schema:
        return "string"
    declared = schema["type"]
    if isinstance(declared, list):  # ["integer", "null"]: the non-null member decides
        members = [str(member).lower() for member in declared if member != "null"]
        return members[0] if members else "null"
    return str(declared).strip().lower()


def _convert(value: str, schema: Any) -> Any:
    """Parameter text to the value its schema declares; the text itself when it does not fit."""
    if value.lower() == "null":
        return None
    if schema is None:
        return value
    kind = _schema_type(schema)
    if kind in _STRING_TYPES:
        return value
    if kind.startswith(_INTEGER_PREFIXES):
        text = value.strip()
        return int(text) if _INTEGER.fullmatch(text) else value
    if kind.startswith(_NUMBER_PREFIXES):
        text = value.strip()
        if not _NUMBER.fullmatch(text):
            return value
        if "." not in text and "e" not in text.lower():
            return int(text)  # "3" for a number is 3, as in SGLang (no float rounding)
        return float(text)
    if kind in _BOOLEAN_TYPES:
        lowered = value.strip().lower()
        return {"true": True, "false": False}.get(lowered, value)
    decoded, error = loads(value)
    return value if error is not None else decoded
