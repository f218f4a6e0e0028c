"""Reading a ``/retrieve`` answer and formatting it for the model, as verl's search tool
does (``verl/tools/utils/search_r1_like_utils.py``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._corpus import split_contents

__all__ = [
    "NO_RESULTS",
    "QUERY_SEPARATOR",
    "RetrievedDocument",
    "format_hits",
    "format_results",
    "parse_response",
]

QUERY_SEPARATOR = "\n---\n"
"""Between the results of two queries (verl's)."""
NO_RESULTS = ""
"""The text for a query without hits: empty, as verl's (so a multi-query answer keeps one
block per query, ``...\\n---\\n`` for an empty one)."""


@dataclass(frozen=True, slots=True)
class RetrievedDocument:
    """One hit of a ``/retrieve`` answer."""

    contents: str
    """``"Title"\\nbody``."""
    id: str | None = None
    score: float | None = None
    """None when the server was asked for (or sent) no scores."""

    @property
    def title(self) -> str:
        """The first line of :attr:`contents` without Search-R1's quotes (the formatted text
        keeps them, as verl's does)."""
        return split_contents(self.contents)[0].strip().strip('"')


def _document(raw: Any, where: str) -> RetrievedDocument:
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: expected an object, got {type(raw).__name__}")
    score: float | None = None
    if "document" in raw:
        doc = raw["document"]
        if not isinstance(doc, Mapping):
            raise ValueError(f"{where}.document: expected an object, got {type(doc).__name__}")
        raw_score = raw.get("score")
        if raw_score is not None:
            if not isinstance(raw_score, int | float) or isinstance(raw_score, bool):
                raise ValueError(f"{where}.score: expected a number, got {raw_score!r}")
            score = float(raw_score)
    else:
        doc = raw
    contents = doc.get("contents")
    if contents is None and ("title" in doc or "text" in doc):
        contents = f'"{doc.get("title") or ""}"\n{doc.get("text") or ""}'
    if not isinstance(contents, str):
        raise ValueError(f"{where}: a document needs a 'contents' string")
    raw_id = doc.get("id")
    return RetrievedDocument(
        contents=contents, id=None if raw_id is None else str(raw_id), score=score
    )


def parse_response(payload: Any, query_count: int) -> list[list[RetrievedDocument]]:
    """The hits of a ``/retrieve`` answer (either hit shape), one list per query;
    ValueError if malformed."""
    if not isinstance(payload, Mapping) or "result" not in payload:
        raise ValueError("expected an object with a 'result' list")
    result = payload["result"]
    if not isinstance(result, list):
        raise ValueError(f"'result' must be a list, got {type(result).__name__}")
    if len(result) != query_count:
        raise ValueError(f"'result' has {len(result)} entries for {query_count} queries")
    parsed: list[list[RetrievedDocument]] = []
    for q, hits in enumerate(result):
        if not isinstance(hits, list):
            raise ValueError(f"result[{q}]: expected a list, got {type(hits).__name__}")
        parsed.append([_document(hit, f"result[{q}][{i}]") for i, hit in enumerate(hits)])
    return parsed


def format_hits(hits: Sequence[RetrievedDocument]) -> str:
    """One query's hits as the model sees them (verl's ``_passages2string``)."""
    if not hits:
        return NO_RESULTS
    blocks = []
    for index, hit in enumerate(hits, start=1):
        title, text = split_contents(hit.contents)
        blocks.append(f"Doc {index} (Title: {title})\n{text}")
    return "\n\n".join(blocks).strip()


def format_results(results: Sequence[Sequence[RetrievedDocument]]) -> str:
    """All queries' hits, joined with :data:`QUERY_SEPARATOR`."""
    return QUERY_SEPARATOR.join(format_hits(hits) for hits in results)
