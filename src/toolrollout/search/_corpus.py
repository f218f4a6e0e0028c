"""Corpus files: JSON Lines in Search-R1's wiki layout (``contents``: a quoted title line,
then the passage), or ``{"id", "title", "text"}`` rows turned into it."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import Any

from toolrollout._exceptions import ConfigError
from toolrollout._jsonarg import jsonl_objects

__all__ = ["Document", "documents_from_rows", "load_corpus", "split_contents"]


def split_contents(contents: str) -> tuple[str, str]:
    """Split Search-R1 ``contents`` into (title line with its quotes, rest), as verl does."""
    title, _, text = contents.partition("\n")
    return title, text


@dataclass(frozen=True, slots=True)
class Document:
    """One corpus passage."""

    id: str
    """The row's ``id`` (as a string); the line number when the row has none."""
    contents: str
    """``"Title"\\nbody``: what is indexed and what the retriever returns."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """The row's other fields (``title``, ``text``, ...), returned with the document."""

    @property
    def title(self) -> str:
        """The first line of :attr:`contents`, without surrounding quotes."""
        return split_contents(self.contents)[0].strip().strip('"')

    def to_json(self) -> dict[str, Any]:
        """The document as the retrieval API returns it (``id``, ``contents``, extras)."""
        return {**self.extra, "id": self.id, "contents": self.contents}

    @classmethod
    def from_row(cls, row: Mapping[str, Any], *, default_id: str) -> Document:
        """Build a document from a corpus row; raises ValueError when it has no text."""
        contents = row.get("contents")
        extra = {k: v for k, v in row.items() if k not in ("id", "contents")}
        if contents is None:
            title, text = row.get("title"), row.get("text")
            if title is None and text is None:
                raise ValueError("a row needs 'contents', or 'title' and/or 'text'")
            for key, value in (("title", title), ("text", text)):
                if value is not None and not isinstance(value, str):
                    raise ValueError(f"'{key}' must be a string, got {type(value).__name__}")
            contents = f'"{title or ""}"\n{text or ""}'
        elif not isinstance(contents, str):
            raise ValueError(f"'contents' must be a string, got {type(contents).__name__}")
        raw_id = row.get("id", default_id)
        if not isinstance(raw_id, str | int) or isinstance(raw_id, bool):
            raise ValueError(f"'id' must be a string or an integer, got {type(raw_id).__name__}")
        return cls(id=str(raw_id), contents=contents, extra=extra)


def _rows(path: Path) -> Iterator[tuple[int, Document]]:
    source = str(path)
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read the corpus: {exc.strerror or exc}") from exc
    with handle:
        for number, row in jsonl_objects(handle, source, ConfigError):
            try:
                yield number, Document.from_row(row, default_id=str(number - 1))
            except ValueError as exc:
                raise ConfigError(f"{source}:{number}: {exc}") from exc


def _unique(numbered: Iterable[tuple[str, Document]], source: str) -> list[Document]:
    documents: list[Document] = []
    seen: dict[str, str] = {}
    for where, document in numbered:
        if document.id in seen:
            raise ConfigError(
                f"{where}: duplicate id {document.id!r} (also at {seen[document.id]})"
            )
        seen[document.id] = where
        documents.append(document)
    if not documents:
        raise ConfigError(f"{source}: the corpus has no documents")
    return documents


def load_corpus(path: str | PathLike[str]) -> list[Document]:
    """Read a JSON Lines corpus (unique ids, not empty); every problem is a ConfigError
    naming the file and line."""
    source = Path(path)
    return _unique(((f"{source}:{n}", doc) for n, doc in _rows(source)), str(source))


def documents_from_rows(rows: Iterable[Mapping[str, Any]]) -> list[Document]:
    """Documents from in-memory rows, with the same rules as :func:`load_corpus`."""

    def numbered() -> Iterator[tuple[str, Document]]:
        for index, row in enumerate(rows):
            try:
                yield f"corpus row {index}", Document.from_row(row, default_id=str(index))
            except ValueError as exc:
                raise ConfigError(f"corpus row {index}: {exc}") from exc

    return _unique(numbered(), "corpus")
