"""Fenced code blocks of the documentation pages, and the markers that say how to run them.

See tests/docs/test_docs_run.py for the conventions; this module only reads Markdown.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PAGES = (
    "README.md",
    "tool_configs/README.md",
    *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md")),
)
"""Every page the docs test reads, relative to the repository root."""

_FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w+-]*)\s*$")
_MARKER = re.compile(r"^\s*<!--\s*(?P<kind>not-run|docs-test):\s*(?P<value>.*?)\s*-->\s*$")

RUNNABLE = {"bash": "bash", "sh": "bash", "console": "bash", "python": "python", "py": "python"}
"""Fence languages the test runs, and as what."""

ASYNCIO_REPL = "# asyncio REPL"
"""First line of a Python block that is asyncio-REPL code (top-level ``await``)."""


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language, its text and its markers."""

    page: str
    line: int
    """1-based line of the opening fence."""
    lang: str
    code: str
    not_run: str | None
    """The reason of a ``<!-- not-run: ... -->`` marker, if any."""
    options: tuple[str, ...]
    """The values of ``<!-- docs-test: ... -->`` markers (e.g. ``serve``, ``continues``)."""

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def kind(self) -> str | None:
        """``bash``, ``python`` or ``None`` for a block that is not code to run."""
        return RUNNABLE.get(self.lang)

    @property
    def first_line(self) -> str:
        return next((ln.strip() for ln in self.code.splitlines() if ln.strip()), "")


def read_blocks(page: str) -> list[Block]:
    """The fenced blocks of ``page`` in order, with the marker lines right above each."""
    lines = (REPO / page).read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        indent = match["indent"]
        end = i + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        if end == len(lines):
            raise ValueError(f"{page}:{i + 1}: unclosed code fence")
        body = [ln[len(indent) :] if ln.startswith(indent) else ln for ln in lines[i + 1 : end]]
        not_run: str | None = None
        options: list[str] = []
        j = i - 1
        while j >= 0 and (marker := _MARKER.match(lines[j])) is not None:
            if marker["kind"] == "not-run":
                not_run = marker["value"]
            else:
                options.insert(0, marker["value"])
            j -= 1
        blocks.append(
            Block(page, i + 1, match["lang"], "\n".join(body) + "\n", not_run, tuple(options))
        )
        i = end + 1
    return blocks
