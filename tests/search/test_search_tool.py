"""The ``search`` client tool: against the real retriever over HTTP, and against mocks."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from toolrollout._exceptions import (
    ToolArgumentError,
    ToolExecutionError,
    ToolUnavailable,
    UserError,
)
from toolrollout.search import SearchTool, VerlSearchTool
from toolrollout.search._format import format_hits, parse_response
from toolrollout.search._local import free_port
from toolrollout.tools import ToolCallRequest, ToolContext, ToolExecutor

URL = "http://retriever.test/retrieve"

OSTONIA = (
    'Doc 1 (Title: "Ostonia")\nOstonia is a country on the eastern shore of the Aster Sea. '
    "Its capital and largest city is Silverford. The official language of Ostonia is Ostese, "
    "and its currency is the Vormark. Ostonia was founded in 1613."
)


def _answer(queries: list[str], docs: list[list[dict[str, Any]]]) -> dict[str, Any]:
    assert len(queries) == len(docs)
    return {"result": docs}


def _mock(
    handler: Callable[[httpx.Request], httpx.Response], **kwargs: Any
) -> tuple[SearchTool, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return handler(request)

    tool = SearchTool(
        retrieval_service_url=URL,
        transport=httpx.MockTransport(record),
        retry_backoff=0,
        **kwargs,
    )
    return tool, seen


HIT = {"document": {"id": "1", "contents": '"Emu"\nA large flightless bird.'}, "score": 2.5}


async def test_searches_the_real_retriever(retriever_url: str) -> None:
    tool = SearchTool(retrieval_service_url=retriever_url, topk=1)
    result = await tool.call({"query_list": ["capital of Ostonia"]}, ToolContext())
    assert not result.is_error
    assert result.text == OSTONIA
    assert result.metrics == {
        "query_count": 1.0,
        "total_results": 1.0,
        "empty_queries": 0.0,
        "attempts": 1.0,
    }
    assert result.structured is not None
    [[hit]] = result.structured["results"]
    assert hit["id"] == "country-ostonia" and hit["title"] == "Ostonia" and hit["score"] > 0


async def test_several_queries_are_joined_like_verl(retriever_url: str) -> None:
    tool = SearchTool(retrieval_service_url=retriever_url, topk=2)
    result = await tool.call(
        {"query_list": ["capital of Ostonia", "Nyxine loom", "xyzzy"]}, ToolContext()
    )
    blocks = result.text.split("\n---\n")
    assert len(blocks) == 3
    assert blocks[0].startswith(OSTONIA + "\n\nDoc 2 (Title: ")
    assert blocks[1].startswith('Doc 1 (Title: "Nyxine loom")\nThe Nyxine loom is a weaving')
    assert blocks[2] == ""  # verl's text for a query without hits
    assert result.metrics["total_results"] == 4.0
    assert result.metrics["empty_queries"] == 1.0


async def test_single_query_string_and_json_format(retriever_url: str) -> None:
    tool = VerlSearchTool(retrieval_service_url=retriever_url, topk=1)
    result = await tool.call({"query": "capital of Ostonia"}, ToolContext())
    assert json.loads(result.text) == {"result": OSTONIA}


async def test_through_the_executor(retriever_url: str) -> None:
    executor = ToolExecutor([SearchTool(retrieval_service_url=retriever_url)])
    ok, bad, empty = await executor.run_calls(
        [
            ToolCallRequest("search", '{"query_list": ["Who invented the Nyxine loom?"]}'),
            ToolCallRequest("search", {"query_list": "not a list"}),
            ToolCallRequest("search", {"query_list": []}),
        ]
    )
    assert not ok.is_error and "Lucan Vanewell" in ok.text
    assert bad.is_error and isinstance(bad.error, ToolArgumentError)
    assert "'query_list' must be a list of strings" in bad.text
    assert empty.is_error and isinstance(empty.error, ToolArgumentError)


async def test_retries_503_then_succeeds() -> None:
    statuses = iter([503, 502, 200])

    def handler(request: httpx.Request) -> httpx.Response:
        status = next(statuses)
        if status != 200:
            return httpx.Response(status, text="warming up")
        body = json.loads(request.content)
        return httpx.Response(200, json=_answer(body["queries"], [[HIT]]))

    tool, seen = _mock(handler)
    result = await tool.call({"query_list": ["emu"]}, ToolContext())
    assert result.text == 'Doc 1 (Title: "Emu")\nA large flightless bird.'
    assert result.metrics["attempts"] == 3.0
    assert len(seen) == 3
    assert json.loads(seen[0].content) == {"queries": ["emu"], "topk": 3, "return_scores": True}


async def test_retries_connection_errors() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(200, json={"result": [[HIT]]})

    tool, _ = _mock(handler)
    result = await tool.call({"query": "emu"}, ToolContext())
    assert result.metrics["attempts"] == 2.0


async def test_persistent_5xx_becomes_an_unavailable_error_result() -> None:
    tool, seen = _mock(lambda request: httpx.Response(503, text="overloaded"), http_retries=2)
    [result] = await ToolExecutor([tool]).run_calls([ToolCallRequest("search", {"query": "x"})])
    assert result.is_error and isinstance(result.error, ToolUnavailable)
    assert "HTTP 503 (3 attempts): overloaded" in result.text
    assert len(seen) == 3  # the executor does not retry on top of the tool's own retries


async def test_unreachable_server_is_unavailable() -> None:
    url = f"http://127.0.0.1:{free_port()}/retrieve"
    tool = SearchTool(retrieval_service_url=url, http_retries=1, retry_backoff=0)
    [result] = await ToolExecutor([tool]).run_calls([ToolCallRequest("search", {"query": "x"})])
    assert isinstance(result.error, ToolUnavailable)
    assert "cannot reach the retrieval service" in result.text
    assert isinstance(result.error.__cause__, httpx.ConnectError)


@pytest.mark.parametrize(
    ("response", "message"),
    [
        (httpx.Response(422, json={"detail": "bad topk"}), "rejected the request with HTTP 422"),
        (httpx.Response(200, text="<html>"), "invalid JSON"),
        (httpx.Response(200, json={"hits": []}), "expected an object with a 'result' list"),
        (httpx.Response(200, json={"result": []}), "'result' has 0 entries for 1 queries"),
        (httpx.Response(200, json={"result": [[{"document": {"id": 1}}]]}), "'contents'"),
    ],
)
async def test_bad_answers_are_execution_errors(response: httpx.Response, message: str) -> None:
    tool, seen = _mock(lambda request: response)
    [result] = await ToolExecutor([tool]).run_calls([ToolCallRequest("search", {"query": "x"})])
    assert result.is_error and isinstance(result.error, ToolExecutionError)
    assert message in result.text
    assert len(seen) == 1  # 4xx and malformed answers are not retried


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({}, "missing required argument 'query_list'"),
        ({"query": 3}, "'query' must be a string"),
        ({"query_list": ["a", 2]}, "must be a list of strings"),
        ({"query_list": ["ok", "  "]}, "a query is empty"),
        ({"query_list": ["a"], "query": "b"}, "not both"),
        ({"query_list": ["a", "b", "c"]}, "3 queries; at most 2 per call"),
    ],
)
def test_argument_errors(arguments: dict[str, Any], message: str) -> None:
    tool = SearchTool(retrieval_service_url=URL, max_queries=2)
    with pytest.raises(ToolArgumentError, match=message):
        tool.check_arguments(arguments)


def test_parse_both_hit_shapes_and_title_text_documents() -> None:
    payload = {
        "result": [
            [{"id": "a", "contents": '"A"\nalpha'}],
            [{"document": {"title": "B", "text": "beta"}, "score": 1}],
        ]
    }
    first, second = parse_response(payload, 2)
    assert first[0].id == "a" and first[0].score is None
    assert second[0].contents == '"B"\nbeta' and second[0].score == 1.0
    assert format_hits(first + second) == 'Doc 1 (Title: "A")\nalpha\n\nDoc 2 (Title: "B")\nbeta'


def test_headers_and_url_normalisation() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["authorization"] == "Bearer t"
        assert request.url.path == "/retrieve"
        return httpx.Response(200, json={"result": [[]]})

    tool = SearchTool(
        retrieval_service_url="http://retriever.test:8000",
        headers={"Authorization": "Bearer t"},
        transport=httpx.MockTransport(handler),
    )
    assert tool.retrieval_service_url == "http://retriever.test:8000/retrieve"
    assert tool.schema()["function"]["name"] == "search"
    assert tool.schema()["function"]["parameters"]["required"] == ["query_list"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"retrieval_service_url": "ftp://x/retrieve"}, "must be an http"),
        ({"retrieval_service_url": URL, "topk": 0}, "topk must be >= 1"),
        ({"retrieval_service_url": URL, "result_format": "xml"}, "result_format"),
    ],
)
def test_invalid_settings(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(UserError, match=message):
        SearchTool(**kwargs)
