"""The retriever as a child process (``toolrollout retriever serve``), and the demo corpus."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest

from toolrollout._exceptions import ToolUnavailable, UserError
from toolrollout.search import SearchTool, serve_local_retrievers, serve_retriever_in_background
from toolrollout.search._local import free_port
from toolrollout.search.demo_corpus import (
    DEMO_CORPUS_PATH,
    DEMO_QUESTIONS_PATH,
    build_demo_corpus,
    build_demo_questions,
)
from toolrollout.tools import ToolContext


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_local_retriever_is_started_searched_and_stopped(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    rows = [
        {"id": "a", "title": "Quokka", "text": "A small marsupial from Rottnest Island."},
        {"id": "b", "title": "Emu", "text": "A large flightless bird."},
    ]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    url = f"http://localhost:{free_port()}/retrieve"
    tool = SearchTool(retrieval_service_url=url, topk=1, local_corpus=str(corpus))
    async with serve_local_retrievers([tool]) as [retriever]:
        assert retriever.corpus == corpus
        assert retriever.retrieve_url == url.replace("localhost", "127.0.0.1")
        async with httpx.AsyncClient() as client:
            health = (await client.get(retriever.url + "/health")).json()
        assert health["documents"] == 2
        result = await tool.call({"query": "flightless bird"}, ToolContext())
        assert result.text == 'Doc 1 (Title: "Emu")\nA large flightless bird.'
        # Where something already listens, nothing is started.
        async with serve_local_retrievers([tool]) as started:
            assert started == []
    assert not _alive(retriever.pid)


async def test_a_retriever_that_dies_at_start_up_reports_its_output(tmp_path: Path) -> None:
    corpus = tmp_path / "broken.jsonl"
    corpus.write_text("{not json\n", encoding="utf-8")
    with pytest.raises(ToolUnavailable, match=r"exited with code 2(.|\n)*broken\.jsonl:1"):
        async with serve_retriever_in_background(corpus):
            pass


async def test_local_retriever_requests_are_checked() -> None:
    with pytest.raises(UserError, match="corpus file not found"):
        async with serve_retriever_in_background("no/such/corpus.jsonl"):
            pass
    remote = SearchTool(retrieval_service_url="http://example.org/retrieve", local_corpus="demo")
    with pytest.raises(UserError, match="needs a local retrieval_service_url"):
        async with serve_local_retrievers([remote]):
            pass
    port = free_port()
    url = f"http://127.0.0.1:{port}/retrieve"
    a = SearchTool(name="a", retrieval_service_url=url, local_corpus="demo")
    b = SearchTool(name="b", retrieval_service_url=url, local_corpus=str(DEMO_QUESTIONS_PATH))
    with pytest.raises(UserError, match="tools 'a' and 'b' need different services"):
        async with serve_local_retrievers([a, b]):
            pass


def test_bundled_demo_files_are_the_generated_ones() -> None:
    corpus = [json.loads(line) for line in DEMO_CORPUS_PATH.read_text("utf-8").splitlines()]
    questions = [json.loads(line) for line in DEMO_QUESTIONS_PATH.read_text("utf-8").splitlines()]
    assert corpus == build_demo_corpus()
    assert questions == build_demo_questions()
    assert DEMO_CORPUS_PATH.stat().st_size < 1_000_000
    ids = {row["id"] for row in corpus}
    assert len(ids) == len(corpus) == 90
    assert all(set(q["doc_ids"]) <= ids for q in questions)
    assert {q["hops"] for q in questions} == {1, 2}
