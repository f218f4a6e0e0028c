"""An in-memory BM25 index over a corpus, built on ``bm25s`` (numpy sparse scoring).

Tokenisation is bm25s's: lower-cased ``\\w\\w+`` words, English stop words removed and,
when PyStemmer is importable, Snowball English stemming (``capitals`` finds ``capital``).
Everything runs offline: bm25s ships its stop-word lists and PyStemmer is compiled code.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from toolrollout._exceptions import UserError

from ._corpus import Document

__all__ = ["Bm25Retriever", "Hit"]


@dataclass(frozen=True, slots=True)
class Hit:
    """One retrieved document and its BM25 score."""

    document: Document
    score: float


def _english_stemmer() -> Any | None:
    try:
        import Stemmer  # PyStemmer
    except ImportError:
        return None
    return Stemmer.Stemmer("english")


class Bm25Retriever:
    """BM25 over a list of documents; the index is built in the constructor.

    Documents whose score is 0 (no query term in common) are never returned, so a query can
    get fewer than ``topk`` hits, as with Search-R1's Lucene BM25 retriever.
    """

    def __init__(
        self,
        documents: Sequence[Document],
        *,
        stemming: bool = True,
        stopwords: str | None = "en",
        k1: float = 1.5,
        b: float = 0.75,
    ) -> None:
        """``stemming`` needs PyStemmer (a dependency); without it, words are not stemmed."""
        import bm25s

        if not documents:
            raise UserError("a BM25 index needs at least one document")
        started = time.perf_counter()
        self._documents = list(documents)
        self._stemmer = _english_stemmer() if stemming else None
        self._stopwords = stopwords
        # PyStemmer's stemmer objects are not thread-safe; the server answers from a thread
        # pool, so tokenising and scoring are serialised (both take microseconds per query).
        self._lock = threading.Lock()
        corpus_tokens = bm25s.tokenize(
            [d.contents for d in self._documents],
            stopwords=self._stopwords or [],
            stemmer=self._stemmer,
            show_progress=False,
        )
        self._index = bm25s.BM25(k1=k1, b=b)
        self._index.index(corpus_tokens, show_progress=False)
        self.index_seconds = time.perf_counter() - started
        """Time spent building the index."""

    @property
    def documents(self) -> Sequence[Document]:
        """The indexed documents, in corpus order."""
        return self._documents

    @property
    def stemming(self) -> bool:
        """Whether words are stemmed (False when PyStemmer is missing or it was disabled)."""
        return self._stemmer is not None

    def _tokenize_queries(self, texts: list[str]) -> list[list[str]]:
        import bm25s

        # Strings, not ids: the index maps them onto its own vocabulary.
        tokens: list[list[str]] = bm25s.tokenize(
            texts,
            stopwords=self._stopwords or [],
            stemmer=self._stemmer,
            return_ids=False,
            show_progress=False,
        )
        return tokens

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        """The best ``topk`` documents for each query, best first, one list per query."""
        if topk < 1:
            raise UserError(f"topk must be >= 1, got {topk}")
        if not queries:
            return []
        k = min(topk, len(self._documents))
        with self._lock:
            tokens = self._tokenize_queries(list(queries))
            indices, scores = self._index.retrieve(tokens, k=k, show_progress=False, n_threads=0)
        results: list[list[Hit]] = []
        for row_indices, row_scores in zip(indices.tolist(), scores.tolist(), strict=True):
            results.append(
                [
                    Hit(self._documents[int(i)], float(s))
                    for i, s in zip(row_indices, row_scores, strict=True)
                    if s > 0
                ]
            )
        return results
