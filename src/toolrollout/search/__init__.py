"""Search: a client tool for Search-R1's retrieval API, and a local BM25 retriever.

- :class:`SearchTool` calls any server that speaks Search-R1's ``POST /retrieve``;
  ``VerlSearchTool`` is what verl's ``SearchTool`` loads as from a tool config.
- ``toolrollout retriever serve`` serves a JSON Lines corpus with BM25
  (:class:`Bm25Retriever`); :func:`serve_retriever_in_background` runs it as a child
  process, and a tool with ``local_corpus`` asks for one (:class:`LocalRetrieverService`).

Importing this package imports neither bm25s nor FastAPI.
"""

from __future__ import annotations

from ._bm25 import Bm25Retriever as Bm25Retriever
from ._client import SearchTool as SearchTool
from ._client import VerlSearchTool as VerlSearchTool
from ._corpus import load_corpus as load_corpus
from ._local import LocalRetrieverService as LocalRetrieverService
from ._local import serve_local_retrievers as serve_local_retrievers
from ._local import serve_retriever_in_background as serve_retriever_in_background

__all__ = [
    "Bm25Retriever",
    "LocalRetrieverService",
    "SearchTool",
    "VerlSearchTool",
    "load_corpus",
    "serve_local_retrievers",
    "serve_retriever_in_background",
]
