"""Loading the search tool from tool-config YAML, in toolrollout's and verl's layouts."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolrollout._exceptions import ConfigError
from toolrollout.search import SearchTool, VerlSearchTool
from toolrollout.tools import ToolContext, load_tool_config

REPO = Path(__file__).resolve().parents[2]

# verl's examples/sglang_multiturn/config/tool_config/search_tool_config.yaml, verbatim.
VERL_SEARCH = """\
tools:
  - class_name: verl.tools.search_tool.SearchTool
    config:
      retrieval_service_url: http://127.0.0.1:8000/retrieve
      num_workers: 120
      rate_limit: 120
      timeout: 30
      type: native
    tool_schema:
      type: function
      function:
        name: search
        description: Searches the web for relevant information based on the given query.
        parameters:
          type: object
          properties:
            query_list:
              type: array
              item:
                type: string
              description: A list of fully-formed semantic queries. The tool will return search results for each query.
          required: 
            - query_list
"""  # noqa: E501, W291


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tools.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_verl_search_config_loads_verbatim(tmp_path: Path) -> None:
    [tool] = load_tool_config(_write(tmp_path, VERL_SEARCH))
    assert isinstance(tool, VerlSearchTool)
    assert tool.name == "search"
    assert tool.description.startswith("Searches the web")
    assert tool.retrieval_service_url == "http://127.0.0.1:8000/retrieve"
    assert tool.topk == 3 and tool.result_format == "json"
    assert tool.request_timeout == 30.0
    assert tool.limits.timeout == 30.0
    assert tool.limits.max_concurrency == 120  # num_workers
    assert tool.limits.rate_limit == 120.0
    assert tool.limits.retry.retries == 0  # HTTP retries happen inside the tool


async def test_verl_config_searches_the_real_retriever(tmp_path: Path, retriever_url: str) -> None:
    text = VERL_SEARCH.replace("http://127.0.0.1:8000/retrieve", retriever_url)
    text = text.replace("      timeout: 30\n", "      timeout: 30\n      topk: 1\n")
    [tool] = load_tool_config(_write(tmp_path, text))
    result = await tool.call({"query_list": ["capital of Ostonia"]}, ToolContext())
    assert result.text.startswith('{"result": "Doc 1 (Title: \\"Ostonia\\")\\nOstonia is a')


def test_type_search_with_own_keys(tmp_path: Path) -> None:
    text = """\
tools:
  - class_name: toolrollout.search.SearchTool
    config:
      type: search
      retrieval_service_url: http://localhost:9000
      topk: 5
      request_timeout: 4
      http_retries: 1
      max_queries: 4
      headers: {X-Key: abc}
      max_concurrency: 8
      retries: 1
"""
    [tool] = load_tool_config(_write(tmp_path, text))
    assert isinstance(tool, SearchTool) and not isinstance(tool, VerlSearchTool)
    assert tool.retrieval_service_url == "http://localhost:9000/retrieve"
    assert (tool.topk, tool.request_timeout, tool.http_retries, tool.max_queries) == (5, 4, 1, 4)
    assert dict(tool.headers) == {"X-Key": "abc"}
    assert tool.result_format == "text"
    assert tool.limits.max_concurrency == 8 and tool.limits.retry.retries == 1


def test_bundled_search_config_loads() -> None:
    [tool] = load_tool_config(REPO / "tool_configs" / "search.yaml")
    assert isinstance(tool, SearchTool)
    assert tool.name == "search"
    assert tool.retrieval_service_url == "http://127.0.0.1:8000/retrieve"
    assert tool.local_corpus == "demo"
    assert tool.schema()["function"]["parameters"]["required"] == ["query_list"]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("{type: search}", r"class_name: config\.retrieval_service_url: is required"),
        (
            "{type: search, retrieval_service_url: 'http://x/retrieve', topK: 3}",
            r"config\.topK: unknown key",
        ),
        (
            "{type: search, retrieval_service_url: 'http://x/retrieve', topk: 0}",
            r"config\.topk: Input should be greater than 0",
        ),
        ("{type: search, retrieval_service_url: 'not a url'}", "must be an http"),
    ],
)
def test_bad_search_configs(tmp_path: Path, config: str, message: str) -> None:
    text = f"tools:\n  - class_name: toolrollout.search.SearchTool\n    config: {config}\n"
    with pytest.raises(ConfigError, match=message):
        load_tool_config(_write(tmp_path, text))


def test_type_search_needs_a_search_tool(tmp_path: Path) -> None:
    text = "tools:\n  - class_name: toolrollout.tools.CalculatorTool\n    config: {type: search}\n"
    with pytest.raises(ConfigError, match=r"tools\[0\]\.class_name: type 'search' needs"):
        load_tool_config(_write(tmp_path, text))
