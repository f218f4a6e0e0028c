"""Pythonic tool calls: ``[f(a=1, b="x"), g()]`` (Llama 3.2 / Llama 4 style).

The call list is parsed with :func:`ast.parse` and every argument value goes through
:func:`ast.literal_eval` on its own AST node, which accepts only literals (strings,
numbers, tuples, lists, dicts, sets, booleans, ``None``). Nothing the model writes is ever
executed: ``__import__('os').system(...)`` is a call node, not a literal, so it becomes a
parse error (verl PR #6542 fixed exactly this kind of ``eval`` RCE in a Qwen3 parser).
"""

from __future__ import annotations

import ast
import math
import re
from typing import Any

from ._base import CallCollector, ParsedTurn, ToolCallParser, clip, join_content

__all__ = ["PythonicParser"]

_LIST_START = re.compile(r"^[ \t]*\[\s*[A-Za-z_][\w.]*\s*\(", re.MULTILINE)
_MAX_ATTEMPTS = 256
_MAX_DEPTH = 64
_PARSE_ERRORS = (SyntaxError, ValueError, TypeError, MemoryError, RecursionError)


class _NotJson(Exception):
    """A literal that has no JSON form (set, bytes, complex, non-string key, NaN...)."""


class PythonicParser(ToolCallParser):
    """A Python list of keyword-argument calls, at the start of a line.

    Text before the list (on earlier lines) and after it is content. The
    ``<|python_start|>``/``<|python_end|>`` wrappers of Llama 4 are ignored. Positional
    arguments, ``**kwargs`` and non-literal values are malformed calls.
    """

    name = "pythonic"
    call_markers = ("[", "<|python_start|>")

    def forced_call_prefix(self, name: str | None = None) -> str | None:
        return "[" if name is None else f"[{name}("

    def parse_body(self, text: str) -> ParsedTurn:
        """Find the first call list and convert its calls."""
        collector = CallCollector(self)
        text = text.replace("<|python_start|>", "").replace("<|python_end|>", "")
        match = _LIST_START.search(text)
        if match is None:
            return collector.turn(text.strip())
        start = text.index("[", match.start())
        parsed = _parse_list(text, start)
        if parsed is None:
            collector.error(
                "could not parse the tool-call list: expected [name(arg=literal, ...), ...]",
                text[start:],
            )
            return collector.turn(text[:start].strip())
        node, source, end = parsed
        for element in node.elts:
            self._convert_call(element, source, collector)
        return collector.turn(join_content([text[:start], text[end:]]))

    def _convert_call(self, element: ast.expr, source: str, collector: CallCollector) -> None:
        raw = clip(ast.get_source_segment(source, element) or "")
        if not isinstance(element, ast.Call):
            collector.error("each element of the tool-call list must be a call", raw)
            return
        name = _dotted_name(element.func)
        if name is None:
            collector.error("the called object must be a plain (dotted) name", raw)
            return
        if element.args:
            collector.error(f"the call to {name!r} has positional arguments; use name=value", raw)
            return
        arguments: dict[str, Any] = {}
        for keyword in element.keywords:
            if keyword.arg is None:
                collector.error(f"the call to {name!r} uses **kwargs", raw)
                return
            try:
                value = ast.literal_eval(keyword.value)
                arguments[keyword.arg] = _to_json(value, 0)
            except _NotJson as exc:
                collector.error(
                    f"argument {keyword.arg!r} of the call to {name!r} has no JSON form ({exc})",
                    raw,
                )
                return
            except _PARSE_ERRORS:
                collector.error(
                    f"argument {keyword.arg!r} of the call to {name!r} is not a literal "
                    "(only strings, numbers, lists, dicts, True/False/None are allowed)",
                    raw,
                )
                return
        collector.add((name, arguments))


def _parse_list(text: str, start: int) -> tuple[ast.List, str, int] | None:
    """Parse the shortest ``[...]`` at ``start`` that is a list display.

    Returns the list node, the source it was parsed from, and the end offset in ``text``.
    """
    attempts = 0
    close = text.find("]", start)
    while close != -1 and attempts < _MAX_ATTEMPTS:
        attempts += 1
        candidate = text[start : close + 1]
        try:
            tree = ast.parse(candidate, mode="eval")
        except _PARSE_ERRORS:
            close = text.find("]", close + 1)
            continue
        if isinstance(tree.body, ast.List):
            return tree.body, candidate, close + 1
        return None
    return None


def _dotted_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted_name(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _to_json(value: Any, depth: int) -> Any:
    """Convert a literal to JSON-compatible data; tuples become lists."""
    if depth > _MAX_DEPTH:
        raise _NotJson("nested too deeply")
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _NotJson("non-finite float")
        return value
    if isinstance(value, (list, tuple)):
        return [_to_json(item, depth + 1) for item in value]
    if isinstance(value, dict):
        result: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise _NotJson(f"dict key {key!r} is not a string")
            result[key] = _to_json(item, depth + 1)
        return result
    raise _NotJson(f"{type(value).__name__} literal")
