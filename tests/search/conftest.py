"""Fixtures: the demo corpus indexed once, served over HTTP from a thread on a free port."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn

from toolrollout.search import Bm25Retriever, load_corpus
from toolrollout.search._local import free_port
from toolrollout.search.demo_corpus import DEMO_CORPUS_PATH
from toolrollout.search.retriever import create_retriever_app


@pytest.fixture(scope="session")
def demo_retriever() -> Bm25Retriever:
    return Bm25Retriever(load_corpus(DEMO_CORPUS_PATH))


@pytest.fixture(scope="session")
def retriever_url(demo_retriever: Bm25Retriever) -> Iterator[str]:
    """``http://127.0.0.1:PORT/retrieve`` of a real uvicorn server over the demo corpus."""
    port = free_port()
    config = uvicorn.Config(
        create_retriever_app(demo_retriever, default_topk=3),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="off",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="retriever", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test retriever did not start")
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}/retrieve"
    server.should_exit = True
    thread.join(10)
