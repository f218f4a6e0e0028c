"""The BM25 retriever and its Search-R1-compatible HTTP API; corpus loading."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from toolrollout._exceptions import ConfigError
from toolrollout.search import Bm25Retriever, load_corpus
from toolrollout.search._corpus import documents_from_rows
from toolrollout.search.demo_corpus import load_demo_questions
from toolrollout.search.retriever import create_retriever_app


@pytest.fixture(scope="module")
def client(demo_retriever: Bm25Retriever) -> TestClient:
    return TestClient(create_retriever_app(demo_retriever, default_topk=3))


def _retrieve(client: TestClient, **body: Any) -> Any:
    response = client.post("/retrieve", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_response_shape_with_scores(client: TestClient) -> None:
    queries = ["capital of Ostonia", "Who invented the Nyxine loom?", "Vormark currency"]
    data = _retrieve(client, queries=queries, topk=2, return_scores=True)
    assert list(data) == ["result"]
    assert len(data["result"]) == len(queries)
    for hits in data["result"]:
        assert len(hits) == 2
        for hit in hits:
            assert set(hit) == {"document", "score"}
            assert isinstance(hit["score"], float) and hit["score"] > 0
            assert isinstance(hit["document"]["id"], str)
            assert hit["document"]["contents"].startswith('"')
        assert hits[0]["score"] >= hits[1]["score"]


def test_response_shape_without_scores(client: TestClient) -> None:
    data = _retrieve(client, queries=["capital of Ostonia", "Nyxine loom"], topk=1)
    assert [len(hits) for hits in data["result"]] == [1, 1]
    document = data["result"][0][0]
    assert document["id"] == "country-ostonia"
    assert set(document) == {"id", "contents"}
    assert document["contents"].startswith('"Ostonia"\nOstonia is a country')


def test_default_and_large_topk(client: TestClient) -> None:
    assert len(_retrieve(client, queries=["capital"])["result"][0]) == 3  # the server's --topk
    hits = _retrieve(client, queries=["capital"], topk=1000)["result"][0]
    assert 30 <= len(hits) <= 90  # only documents sharing a term; never more than the corpus


def test_query_without_matches_and_empty_batch(client: TestClient) -> None:
    assert _retrieve(client, queries=["xyzzy plugh", "the of and"])["result"] == [[], []]
    assert _retrieve(client, queries=[])["result"] == []


def test_health(client: TestClient) -> None:
    response = client.get("/health")
    assert response.status_code == 200
    assert response.json() == {
        "status": "ok",
        "retriever": "bm25s",
        "documents": 90,
        "stemming": True,
        "topk": 3,
    }


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"queries": "capital of Ostonia"},
        {"queries": [1, 2]},
        {"queries": ["x"], "topk": 0},
        {"queries": ["x"], "topk": -3},
        {"queries": ["x"], "topk": 100000},
        {"queries": ["x"], "return_scores": "maybe"},
    ],
)
def test_bad_requests_are_4xx(client: TestClient, body: dict[str, Any]) -> None:
    response = client.post("/retrieve", json=body)
    assert response.status_code == 422, response.text


def test_malformed_json_is_4xx(client: TestClient) -> None:
    response = client.post(
        "/retrieve", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert 400 <= response.status_code < 500


def test_relevance_on_the_demo_questions(demo_retriever: Bm25Retriever) -> None:
    questions = load_demo_questions()
    results = demo_retriever.search([q["question"] for q in questions], topk=1)
    for question, hits in zip(questions, results, strict=True):
        assert hits[0].document.id == question["doc_ids"][0], question["question"]


def test_stemming_matches_word_forms(demo_retriever: Bm25Retriever) -> None:
    [hits] = demo_retriever.search(["designs of lanterns for mines"], topk=1)
    assert hits[0].document.id.endswith("-lantern")


def test_title_text_rows_and_extra_fields_round_trip(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    rows = [
        {"id": 7, "title": "Quokka", "text": "A small marsupial from Rottnest Island."},
        {"title": "Wombat", "text": "A burrowing marsupial.", "source": "wiki"},
        {"contents": '"Emu"\nA large flightless bird.'},
    ]
    corpus.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n", encoding="utf-8")
    documents = load_corpus(corpus)
    assert [d.id for d in documents] == ["7", "1", "2"]
    assert documents[0].contents == '"Quokka"\nA small marsupial from Rottnest Island.'
    assert documents[0].title == "Quokka"
    client = TestClient(create_retriever_app(Bm25Retriever(documents)))
    [[hit]] = _retrieve(client, queries=["burrowing"], topk=1)["result"]
    assert hit == {
        "id": "1",
        "title": "Wombat",
        "text": "A burrowing marsupial.",
        "source": "wiki",
        "contents": '"Wombat"\nA burrowing marsupial.',
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"id": "a", "contents": "x"}\n{broken\n', "corpus.jsonl:2: invalid JSON"),
        ('["a"]\n', "corpus.jsonl:1: expected a JSON object, got list"),
        ('{"id": "a"}\n', "corpus.jsonl:1: a row needs 'contents'"),
        ('{"contents": 5}\n', "corpus.jsonl:1: 'contents' must be a string"),
        ('{"id": "a", "contents": "x"}\n{"id": "a", "contents": "y"}\n', "duplicate id 'a'"),
        ("\n\n", "corpus.jsonl: the corpus has no documents"),
    ],
)
def test_bad_corpus_is_a_config_error(tmp_path: Path, text: str, message: str) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match=message):
        load_corpus(corpus)


def test_missing_corpus_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the corpus"):
        load_corpus(tmp_path / "nope.jsonl")
    with pytest.raises(ConfigError, match="corpus row 1"):
        documents_from_rows([{"contents": "ok"}, {"id": "x"}])
