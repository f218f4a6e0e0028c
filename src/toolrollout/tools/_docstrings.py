"""Just enough docstring parsing to describe a function tool to the model.

Google (``Args:``), NumPy (``Parameters`` + dashes) and Sphinx (``:param x:``) styles are
understood. Only the summary and the parameter descriptions are kept: they are what the
model reads; types come from the annotations, never from the docstring.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field

__all__ = ["ParsedDocstring", "parse_docstring"]

_PARAM_SECTIONS = frozenset(
    {
        "args",
        "arguments",
        "parameters",
        "params",
        "keyword args",
        "keyword arguments",
        "other parameters",
    }
)
_ALL_SECTIONS = _PARAM_SECTIONS | frozenset(
    {
        "returns",
        "return",
        "yields",
        "yield",
        "raises",
        "raise",
        "examples",
        "example",
        "notes",
        "note",
        "attributes",
        "see also",
        "warnings",
        "warning",
        "warns",
        "todo",
        "references",
    }
)
_GOOGLE_HEADER = re.compile(r"^([A-Za-z][A-Za-z ]*?)\s*:\s*$")
_NUMPY_RULE = re.compile(r"^\s*-{3,}\s*$")
_SPHINX_FIELD = re.compile(r"^:(\w+)(?:\s+([^:]+?))?\s*:\s*(.*)$")
_GOOGLE_ENTRY = re.compile(r"^\*{0,2}(\w+)\s*(?:\(([^)]*)\))?\s*:\s*(.*)$")
_NUMPY_ENTRY = re.compile(r"^\*{0,2}(\w+(?:\s*,\s*\*{0,2}\w+)*)\s*(?::\s*(.*))?$")


@dataclass(frozen=True, slots=True)
class ParsedDocstring:
    """The parts of a docstring a tool schema uses."""

    description: str = ""
    """Summary and body up to the first section, lines of a paragraph joined."""
    params: dict[str, str] = field(default_factory=dict)
    """Parameter name to its description."""


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _join(lines: list[str]) -> str:
    """Join hard-wrapped lines into paragraphs separated by a blank line."""
    paragraphs: list[str] = []
    current: list[str] = []
    for line in lines:
        if line.strip():
            current.append(line.strip())
        elif current:
            paragraphs.append(" ".join(current))
            current = []
    if current:
        paragraphs.append(" ".join(current))
    return "\n\n".join(paragraphs)


def _parse_entries(lines: list[str], numpy: bool) -> dict[str, str]:
    """Parse the body of a parameter section into ``{name: description}``."""
    body = [line for line in lines if line.strip()]
    if not body:
        return {}
    base = min(_indent(line) for line in body)
    params: dict[str, str] = {}
    names: list[str] = []
    desc: list[str] = []

    def flush() -> None:
        text = " ".join(part for part in desc if part)
        for name in names:
            params[name] = text

    for line in body:
        if _indent(line) == base:
            flush()
            names, desc = [], []
            stripped = line.strip()
            if numpy:
                match = _NUMPY_ENTRY.match(stripped)
                if match:
                    names = [n.strip().lstrip("*") for n in match.group(1).split(",")]
            else:
                match = _GOOGLE_ENTRY.match(stripped)
                if match:
                    names = [match.group(1)]
                    desc = [match.group(3).strip()]
        else:
            desc.append(line.strip())
    flush()
    return params


def parse_docstring(doc: str | None) -> ParsedDocstring:
    """Split ``doc`` into the description and per-parameter descriptions."""
    if not doc or not doc.strip():
        return ParsedDocstring()
    lines = inspect.cleandoc(doc).splitlines()
    description: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    numpy = False
    section_lines: list[str] = []

    def close_section() -> None:
        if section in _PARAM_SECTIONS:
            params.update(_parse_entries(section_lines, numpy))

    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        header: str | None = None
        if _indent(line) == 0 and stripped.lower() in _ALL_SECTIONS and _NUMPY_RULE.match(nxt):
            header, is_numpy, skip = stripped.lower(), True, 2
        elif _indent(line) == 0 and (m := _GOOGLE_HEADER.match(stripped)) is not None:
            if m.group(1).lower() in _ALL_SECTIONS:
                header, is_numpy, skip = m.group(1).lower(), False, 1
        if header is not None:
            close_section()
            section, numpy, section_lines = header, is_numpy, []
            i += skip
            continue
        sphinx = _SPHINX_FIELD.match(stripped)
        if sphinx is not None and _indent(line) == 0:
            close_section()
            section, section_lines = "sphinx", []
            kind, arg, text = sphinx.groups()
            if kind in ("param", "parameter", "arg", "argument", "key", "keyword") and arg:
                name = arg.split()[-1].lstrip("*")
                collected = [text.strip()]
                while i + 1 < len(lines) and lines[i + 1].strip() and _indent(lines[i + 1]) > 0:
                    i += 1
                    collected.append(lines[i].strip())
                params[name] = " ".join(part for part in collected if part)
            i += 1
            continue
        if section is None:
            description.append(line)
        elif section != "sphinx":
            section_lines.append(line)
        i += 1
    close_section()
    return ParsedDocstring(description=_join(description), params=params)
