"""A local retrieval server with Search-R1's API (``POST /retrieve``, as
``search_r1/search/retrieval_server.py``) answering from a BM25 index, and ``GET /health``.
"""

from __future__ import annotations

import dataclasses
import logging
from os import PathLike
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field

from toolrollout._security import SecurityMiddleware, ServerSecurity, check_bind

from ._bm25 import Bm25Retriever, Hit
from ._corpus import load_corpus

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_CONCURRENT_REQUESTS",
    "MAX_QUERIES",
    "MAX_TOPK",
    "Bm25Retriever",
    "Hit",
    "RetrieveRequest",
    "create_retriever_app",
    "retriever_security",
    "run_retriever",
]

logger = logging.getLogger(__name__)

MAX_QUERIES = 4096
"""Most queries one request may carry (a bound on the work one request can ask for)."""
MAX_TOPK = 1000
"""Largest ``topk`` a request may ask for."""
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
"""Largest ``/retrieve`` body by default (thousands of queries fit)."""
DEFAULT_MAX_CONCURRENT_REQUESTS = 256
"""Requests in flight at once by default; more get 429 (the search tool retries those)."""


def retriever_security(**changes: Any) -> ServerSecurity:
    """The retriever's :class:`ServerSecurity` with its default limits and no key."""
    base = ServerSecurity(
        max_body_bytes=DEFAULT_MAX_BODY_BYTES,
        max_concurrent_requests=DEFAULT_MAX_CONCURRENT_REQUESTS,
    )
    return dataclasses.replace(base, **changes)


class RetrieveRequest(BaseModel):
    """The body of ``POST /retrieve`` (Search-R1's ``QueryRequest``)."""

    model_config = ConfigDict(extra="ignore")

    queries: list[str] = Field(max_length=MAX_QUERIES)
    topk: int | None = Field(default=None, ge=1, le=MAX_TOPK)
    """Hits per query; None: the server's ``--topk``."""
    return_scores: bool = False
    """True: each hit is ``{"document": ..., "score": ...}``; False: the bare document."""


def _hit_json(hit: Hit, return_scores: bool) -> dict[str, Any]:
    document = hit.document.to_json()
    return {"document": document, "score": hit.score} if return_scores else document


def create_retriever_app(
    retriever: Bm25Retriever, *, default_topk: int = 3, security: ServerSecurity | None = None
) -> FastAPI:
    """The FastAPI app serving ``retriever`` (``/retrieve`` and ``/health``), guarded by
    ``security`` (default: :func:`retriever_security`, no key)."""
    app = FastAPI(title="toolrollout retriever", docs_url=None, redoc_url=None)
    app.add_middleware(
        SecurityMiddleware,
        security=security if security is not None else retriever_security(),
    )

    # A plain ``def``: FastAPI runs it in its thread pool, off the event loop.
    @app.post("/retrieve")
    def retrieve(request: RetrieveRequest) -> dict[str, Any]:
        topk = request.topk or default_topk
        results = retriever.search(request.queries, topk)
        return {
            "result": [[_hit_json(hit, request.return_scores) for hit in hits] for hits in results]
        }

    # On the event loop, not in the thread pool: the run's liveness probe must be answered
    # while every thread is busy with searches (a busy retriever is not a hung one).
    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "retriever": "bm25s",
            "documents": len(retriever.documents),
            "stemming": retriever.stemming,
            "topk": default_topk,
        }

    return app


def run_retriever(
    corpus: str | PathLike[str],
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    topk: int = 3,
    stemming: bool = True,
    log_level: str = "info",
    security: ServerSecurity | None = None,
    insecure: bool = False,
) -> None:
    """Load ``corpus``, index it, and serve it with uvicorn until interrupted.

    A non-loopback ``host`` needs ``security.api_key`` unless ``insecure``.
    """
    import uvicorn

    security = security if security is not None else retriever_security()
    check_bind(host, security, insecure=insecure, server="the retriever")
    documents = load_corpus(corpus)
    retriever = Bm25Retriever(documents, stemming=stemming)
    logger.info(
        "indexed %d documents from %s in %.2fs (stemming: %s)",
        len(documents),
        corpus,
        retriever.index_seconds,
        "on" if retriever.stemming else "off",
    )
    app = create_retriever_app(retriever, default_topk=topk, security=security)
    uvicorn.run(app, host=host, port=port, log_level=log_level)
