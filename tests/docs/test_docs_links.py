"""Links between the docs pages: every relative link names a file that exists, and every
``#anchor`` a heading of that page, spelled as GitHub spells heading anchors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
_LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6} (?P<title>.+?)\s*$", re.MULTILINE)
_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def heading_anchor(title: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation other than ``-`` and ``_``
    dropped, each space a hyphen (so ``a: `--b` `` gives ``a---b``)."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    return {heading_anchor(m["title"]) for m in _HEADING.finditer(text)}


def broken_links(page: Path) -> list[str]:
    """The links of ``page`` whose file or heading does not exist."""
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    broken = []
    for match in _LINK.finditer(text):
        target = match["target"]
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target} (no such heading)")
    return broken


def test_heading_anchors_are_spelled_as_github_spells_them() -> None:
    assert heading_anchor("The collector threshold: `generate`'s default") == (
        "the-collector-threshold-generates-default"
    )
    assert heading_anchor("A batch target over all shards: `--ray --target-groups`") == (
        "a-batch-target-over-all-shards---ray---target-groups"
    )
    assert heading_anchor("Four servers after the prompt-render cut: 0.95 met") == (
        "four-servers-after-the-prompt-render-cut-095-met"
    )


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other page\n\n## A section\n", encoding="utf-8")
    page.write_text(
        "# Page\n\n[ok](other.md#a-section) [self](#page) [gone](missing.md) "
        "[bad](other.md#no-section) [web](https://example.org/#x)\n",
        encoding="utf-8",
    )
    assert broken_links(page) == [
        "missing.md (no such file)",
        "other.md#no-section (no such heading)",
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_link_of_a_page_resolves(page: Path) -> None:
    assert broken_links(page) == []
