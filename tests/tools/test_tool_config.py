"""Tool-config YAML in verl's layout: loading, class resolution, limits, and errors."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest

from toolrollout._exceptions import ConfigError
from toolrollout.tools import (
    CalculatorTool,
    FunctionTool,
    Gsm8kTool,
    Tool,
    ToolCallRequest,
    ToolContext,
    ToolExecutor,
    ToolResult,
    VerlToolAdapter,
    function_tool,
    load_tool_config,
)
from toolrollout.tools._config import tools_from_config

REPO = Path(__file__).resolve().parents[2]

# verl's examples/sglang_multiturn/config/tool_config/gsm8k_tool_config.yaml, verbatim.
VERL_GSM8K = """\
tools:
  - class_name: "verl.tools.gsm8k_tool.Gsm8kTool"
    config: 
      type: native
    tool_schema:
      type: "function"
      function:
        name: "calc_gsm8k_reward"
        description: "A tool for calculating the reward of gsm8k. (1.0 if parsed answer is correct, 0.0 if parsed answer is incorrect or not correctly parsed)"
        parameters:
          type: "object"
          properties:
            answer:
              type: "string"
              description: "The model's answer to the GSM8K math problem, must be a digits"
          required: ["answer"]
"""  # noqa: E501, W291

# verl's search_tool_config.yaml, verbatim (its `item:` typo included).
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
              description: A list of fully-formed semantic queries.
          required: 
            - query_list
"""  # noqa: W291

VERL_MCP = """\
tools:
  - class_name: verl.tools.mcp_search_tool.MCPSearchTool
    config:
      rate_limit: 120
      timeout: 120
      type: mcp
    mcp:
      mcp_servers_config_path: ./mcp_server.json
      tool_selected_list: 
        - tavily_search_tool
"""  # noqa: W291


def write(tmp_path: Path, text: str, name: str = "tools.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# -- a fake user module, importable by name, holding every kind of class_name target ---------


def lookup(query: str, top_k: int = 3) -> str:
    """Look a query up.

    Args:
        query: What to look up.
        top_k: How many hits.
    """
    return f"{query}:{top_k}"


@function_tool
def shout(text: str) -> str:
    """Upper-case the text."""
    return text.upper()


@dataclass(frozen=True, kw_only=True)
class ConfiguredTool(Tool):
    """A Tool subclass that reads its own config keys."""

    greeting: str = "hello"
    received: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any], tool_schema: Mapping[str, Any] | None = None
    ) -> Tool:
        return cls(name="greet", greeting=config["greeting"], received=dict(config))

    async def call(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        return ToolResult(text=f"{self.greeting}, {arguments.get('who', 'you')}")


class FakeResponse:
    def __init__(self, text: str) -> None:
        self.text = text
        self.image = None


class FakeVerlTool:
    """Shaped like verl's BaseTool: create/execute/release around one instance per call."""

    events: ClassVar[list[tuple[str, Any]]] = []

    def __init__(self, config: dict[str, Any], tool_schema: Any) -> None:
        self.config = config
        self.tool_schema = tool_schema
        self.name = tool_schema.function.name

    def get_openai_tool_schema(self) -> Any:
        return self.tool_schema

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, Any]:
        self.events.append(("create", kwargs["create_kwargs"]))
        return "inst-1", FakeResponse("")

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[Any, float, dict[str, Any]]:
        self.events.append(("execute", parameters))
        return FakeResponse(f"got {parameters['answer']}"), 0.5, {"n": 1.0}

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self.events.append(("release", instance_id))


@pytest.fixture(autouse=True)
def fake_module(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    module = types.ModuleType("fake_user_tools")
    for obj in (lookup, ConfiguredTool, FakeVerlTool):
        setattr(module, obj.__name__, obj)
    module.shout = shout  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_user_tools", module)
    FakeVerlTool.events = []
    yield


# -- loading ----------------------------------------------------------------------------------


async def test_verl_gsm8k_config_loads_verbatim_and_runs(tmp_path: Path) -> None:
    [tool] = load_tool_config(write(tmp_path, VERL_GSM8K))
    assert isinstance(tool, Gsm8kTool)
    assert tool.name == "calc_gsm8k_reward"
    assert tool.description.startswith("A tool for calculating the reward of gsm8k.")
    assert tool.schema()["function"]["parameters"]["required"] == ["answer"]
    executor = ToolExecutor([tool])
    context = ToolContext(ground_truth="72")
    [wrong, right] = [
        (await executor.run_calls([ToolCallRequest("calc_gsm8k_reward", {"answer": a})], context))[
            0
        ]
        for a in ("70", "72")
    ]
    assert wrong.text == "Current parsed answer='70' reward=0.0" and wrong.reward == -0.05
    assert right.text == "Current parsed answer='72' reward=1.0" and right.reward == 0.0


def test_shipped_calculator_config(tmp_path: Path) -> None:
    [tool] = load_tool_config(REPO / "tool_configs" / "calculator.yaml")
    assert isinstance(tool, CalculatorTool)
    assert tool.name == "calculator"
    assert tool.limits.timeout == 5 and tool.limits.max_concurrency == 64
    assert tool.limits.retry.retries == 0


async def test_module_function_with_schema_override_and_limits(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
tools:
  - class_name: "fake_user_tools:lookup"
    config: {type: native, timeout: 2.5, num_workers: 4, rate_limit: 50, rate_burst: 5,
             retries: {retries: 1, backoff: 0.5, max_backoff: 1, on_timeout: true}}
    tool_schema:
      type: function
      function:
        name: search
        description: Search it.
        parameters:
          type: object
          properties: {query: {type: string}}
          required: [query]
  - class_name: fake_user_tools.shout
""",
    )
    search, shout_tool = load_tool_config(path)
    assert isinstance(search, FunctionTool) and search.name == "search"
    assert search.description == "Search it."
    assert search.parameters["properties"] == {"query": {"type": "string"}}
    limits = search.limits
    assert (limits.timeout, limits.max_concurrency, limits.rate_limit, limits.rate_burst) == (
        2.5,
        4,
        50,
        5,
    )
    assert limits.retry.retries == 1 and limits.retry.initial_backoff == 0.5
    assert limits.retry.retry_timeouts
    assert isinstance(shout_tool, FunctionTool) and shout_tool.fn is shout.fn
    results = await ToolExecutor([search, shout_tool]).run_calls(
        [ToolCallRequest("search", {"query": "q"}), ToolCallRequest("shout", {"text": "hi"})]
    )
    assert [r.text for r in results] == ["q:3", "HI"]


def test_function_without_schema_gets_derived_schema() -> None:
    [tool] = tools_from_config({"tools": [{"class_name": "fake_user_tools:lookup"}]})
    props = tool.parameters["properties"]
    assert props["query"]["description"] == "What to look up."
    assert tool.limits.timeout == 60  # untouched default


def test_tool_subclass_receives_its_config() -> None:
    [tool] = tools_from_config(
        {
            "tools": [
                {
                    "class_name": "fake_user_tools.ConfiguredTool",
                    "config": {"type": "native", "greeting": "hi", "timeout": 3},
                }
            ]
        }
    )
    assert isinstance(tool, ConfiguredTool)
    assert tool.greeting == "hi" and tool.received["timeout"] == 3
    assert tool.limits.timeout == 3


async def test_verl_style_class_is_adapted() -> None:
    [tool] = tools_from_config(
        {
            "tools": [
                {
                    "class_name": "fake_user_tools.FakeVerlTool",
                    "config": {"type": "native", "custom": 1},
                    "tool_schema": {
                        "type": "function",
                        "function": {
                            "name": "check",
                            "description": "Check it.",
                            "parameters": {
                                "type": "object",
                                "properties": {"answer": {"type": "string"}},
                                "required": ["answer"],
                            },
                        },
                    },
                }
            ]
        }
    )
    assert isinstance(tool, VerlToolAdapter) and tool.name == "check"
    assert tool.instance.config["custom"] == 1
    context = ToolContext(metadata={"tools_kwargs": {"check": {"create_kwargs": {"k": "v"}}}})
    [result] = await ToolExecutor([tool]).run_calls(
        [ToolCallRequest("check", {"answer": "4"})], context
    )
    assert result.text == "got 4" and result.reward == 0.5 and result.metrics == {"n": 1.0}
    assert [e[0] for e in FakeVerlTool.events] == ["create", "execute", "release"]
    assert FakeVerlTool.events[0][1] == {"k": "v"}


# -- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "tools:\n  - class_name: fake_user_tools:lookup\n    config: {timeout: -1}\n",
            "tools[0].config.timeout: must be a positive number (got -1)",
        ),
        (
            "tools:\n  - class_name: fake_user_tools:lookup\n    config: {timeout: soon}\n",
            "tools[0].config.timeout: must be a number (got 'soon')",
        ),
        (
            "tools:\n  - class_name: fake_user_tools:lookup\n    tool_shema: {}\n",
            "tools[0].tool_shema: unknown key",
        ),
        ("tools:\n  - config: {type: native}\n", "tools[0].class_name: is required"),
        (
            "tools:\n  - class_name: x.Y\n    config: {type: remote}\n",
            "tools[0].config.type: must be one of 'native', 'mcp', 'sandbox' or 'search'",
        ),
        (
            "tools:\n  - class_name: fake_user_tools:lookup\n    config: {max_concurrency: 1.5}\n",
            "tools[0].config.max_concurrency: must be an integer",
        ),
        (
            "tools:\n  - class_name: fake_user_tools:lookup\n"
            "    tool_schema: {type: function, function: {name: 'bad name'}}\n",
            "tools[0].tool_schema.function.name: must be 1-64 letters",
        ),
        ("tool:\n  - class_name: a.B\n", "tool: unknown key"),
        ("- just a list\n", "expected a mapping with a 'tools' list"),
        (
            "tools:\n  - class_name: no_such_module_xyz.Tool\n",
            "tools[0].class_name: cannot import 'no_such_module_xyz.Tool'",
        ),
        (
            "tools:\n  - class_name: verl.tools.geo3k_tool.Geo3kTool\n",
            "verl classes need verl installed, except those toolrollout maps",
        ),
        (
            "tools:\n  - class_name: fake_user_tools:lookup\n"
            "    tool_schema: {function: {name: s, parameters: {type: object, "
            "properties: {q: {type: string}}}}}\n",
            "tools[0].tool_schema: tool 'lookup': schema property 'q' is not a parameter",
        ),
        (
            "tools:\n  - class_name: fake_user_tools:lookup\n"
            "  - class_name: fake_user_tools:lookup\n",
            "tools[1]: duplicate tool name 'lookup' (also defined by tools[0])",
        ),
        ("tools:\n  - class_name: toolrollout.tools.Tool\n", "cannot be built from a tool config"),
        ("tools: [\n", "invalid YAML at line"),
    ],
)
def test_bad_configs_name_file_and_key(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text, name="bad.yaml")
    with pytest.raises(ConfigError) as info:
        load_tool_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    assert expected in message


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"missing\.yaml: cannot read the file"):
        load_tool_config(tmp_path / "missing.yaml")
