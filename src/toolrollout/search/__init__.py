"""Search: a client tool for Search-R1's retrieval API, and a local BM25 retriever.

- :class:`SearchTool` (tool name ``search``, argument ``query_list``) calls any server that
  speaks Search-R1's ``POST /retrieve``; ``VerlSearchTool`` is what verl's
  ``verl.tools.search_tool.SearchTool`` loads as from a tool config.
- ``toolrollout retriever serve --corpus FILE`` serves a JSON Lines corpus with BM25
  (:class:`Bm25Retriever`; the app is :func:`toolrollout.search.retriever.create_retriever_app`).
- :func:`serve_retriever_in_background` runs that server as a child process; a tool with
  ``local_corpus`` asks for one (:class:`LocalRetrieverService`) in its ``services()``,
  which :func:`toolrollout.tools.open_tools` opens; :func:`serve_local_retrievers` starts
  them for a list of tools. The ``search`` tool type builds them from a tool config.
- :mod:`toolrollout.search.demo_corpus`: a small synthetic corpus and questions about it.

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
