"""Synthetic tasks for the demo's ``search`` tool, over the bundled demo corpus.

The questions are :mod:`toolrollout.search.demo_corpus`'s (one or two searches each),
asked in several wordings in training and in the corpus's own wording in the shipped
prompts. The tool messages are real: the BM25 index ``toolrollout retriever serve`` builds,
formatted as :class:`SearchTool` does (a test compares with the tool over HTTP). A fact is
held out by a stable hash of its canonical question (:func:`is_heldout_question`, ~25%).
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from toolrollout.apps.demo._tasks import Split, hash_heldout

if TYPE_CHECKING:
    from toolrollout.search import Bm25Retriever

__all__ = [
    "TOPK",
    "SearchTask",
    "generate_search_tasks",
    "is_heldout_question",
    "search_schema",
    "search_tasks",
    "search_text",
]

HELDOUT_PERCENT: Final = 25
"""Share of the corpus questions reserved for evaluation (the corpus is small)."""
TOPK: Final = 3
"""Hits per query, as in ``tool_configs/search.yaml``."""


def is_heldout_question(question: str) -> bool:
    """Whether a canonical corpus question is held out (stable hash, ~25%)."""
    return hash_heldout("toolrollout-demo-search", question, HELDOUT_PERCENT)


def search_schema() -> dict[str, Any]:
    """The ``search`` tool's schema as ``tool_configs/search.yaml`` shows it to the model."""
    from toolrollout.search import SearchTool

    return SearchTool(retrieval_service_url="http://127.0.0.1:8000/retrieve").schema()


@functools.cache
def _retriever() -> Bm25Retriever:
    from toolrollout.search import Bm25Retriever, load_corpus
    from toolrollout.search.demo_corpus import DEMO_CORPUS_PATH

    return Bm25Retriever(load_corpus(DEMO_CORPUS_PATH))


def search_text(query: str) -> str:
    """The tool message for ``{"query_list": [query]}`` against the demo corpus."""
    from toolrollout.search._format import RetrievedDocument, format_results

    [hits] = _retriever().search([query], TOPK)
    docs = [RetrievedDocument(h.document.contents, h.document.id, h.score) for h in hits]
    return format_results([docs])


def _title(doc_id: str) -> str:
    from toolrollout.search._format import RetrievedDocument

    for document in _retriever().documents:
        if document.id == doc_id:
            return RetrievedDocument(document.contents).title
    raise KeyError(doc_id)


# Canonical wording (the corpus module's, a pattern) -> other wordings of the same question.
_WORDINGS: Final[dict[str, tuple[str, ...]]] = {
    r"What is the capital of (?P<e>.+)\?": (
        "Which city is the capital of {e}?",
        "Name the capital city of {e}.",
        "what is the capital of {e}",
    ),
    r"What is the currency of (?P<e>.+)\?": (
        "Which currency is used in {e}?",
        "What money does {e} use?",
        "Tell me the currency of {e}.",
    ),
    r"Who invented the (?P<e>.+)\?": (
        "Who is the inventor of the {e}?",
        "Who created the {e}?",
        "Name the inventor of the {e}.",
    ),
    r"In which year was the (?P<e>.+) invented\?": (
        "When was the {e} invented?",
        "What year was the {e} invented?",
        "In what year did someone invent the {e}?",
    ),
    r"In which country was the inventor of the (?P<e>.+) born\?": (
        "Which country does the inventor of the {e} come from?",
        "The inventor of the {e} was born in which country?",
        "Where was the inventor of the {e} born? Name the country.",
    ),
}


@dataclass(frozen=True, slots=True)
class SearchTask:
    """A corpus question, the queries that answer it, each query's tool output, the answer."""

    canonical: str
    """The question in the corpus module's wording (the split key)."""
    question: str
    queries: tuple[str, ...]
    results: tuple[str, ...]
    answer: str

    @property
    def hops(self) -> int:
        return len(self.queries)

    @property
    def split(self) -> Split:
        return "heldout" if is_heldout_question(self.canonical) else "train"


def _wordings(question: str) -> tuple[str, tuple[str, ...]]:
    for pattern, others in _WORDINGS.items():
        match = re.fullmatch(pattern, question)
        if match is not None:
            entity = match.group("e")
            return entity, (question, *(o.format(e=entity) for o in others))
    raise ValueError(f"unknown demo corpus question: {question!r}")


@functools.cache
def search_tasks() -> tuple[tuple[SearchTask, ...], ...]:
    """Every corpus question in all its wordings (one tuple per question, canonical first)."""
    from toolrollout.search.demo_corpus import load_demo_questions

    tasks = []
    for row in load_demo_questions():
        entity, wordings = _wordings(row["question"])
        queries = [entity]
        if row["hops"] == 2:
            queries.append(_title(row["doc_ids"][1]))
        results = tuple(search_text(q) for q in queries)
        answer = str(row["answer"])
        if answer not in results[-1]:
            raise RuntimeError(f"the last search for {row['question']!r} misses {answer!r}")
        if len(queries) == 2 and queries[1] not in results[0]:
            raise RuntimeError(f"the first search for {row['question']!r} misses {queries[1]}")
        tasks.append(
            tuple(SearchTask(row["question"], w, tuple(queries), results, answer) for w in wordings)
        )
    return tuple(tasks)


def generate_search_tasks(
    n: int, *, seed: int, split: Split, canonical_only: bool = False
) -> list[SearchTask]:
    """``n`` tasks of the split, drawn with replacement (the corpus has few questions).

    With ``canonical_only`` each question appears once, in corpus order and wording, and
    ``n`` is a maximum.
    """
    groups: Sequence[tuple[SearchTask, ...]] = [g for g in search_tasks() if g[0].split == split]
    if canonical_only:
        return [g[0] for g in groups][:n]
    rng = random.Random(seed)
    return [rng.choice(rng.choice(groups)) for _ in range(n)]
