"""Function tools: schema from hints and docstrings, validation, calling, return values."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Literal

import pytest
from pydantic import BaseModel

from toolrollout._exceptions import ToolArgumentError, ToolExecutionError, UserError
from toolrollout.tools import FunctionTool, ToolContext, ToolLimits, ToolResult, function_tool
from toolrollout.tools._docstrings import parse_docstring
from toolrollout.tools._function import to_tool_result


class Opaque:
    """Not a type pydantic can describe in JSON schema."""


def opaque(thing: Opaque) -> str:
    return "x"


class Point(BaseModel):
    x: int
    y: int = 0


def google(
    query: str,
    limit: int = 5,
    ratio: float | None = None,
    tags: list[str] | None = None,
    mode: Literal["fast", "slow"] = "fast",
    strict: bool = False,
) -> str:
    """Search the corpus.

    Looks things up
    in the index.

    Args:
        query (str): What to look for,
            in plain words.
        limit: Maximum hits.
        ratio: Score cut-off.
        tags: Only these tags.
        mode: Speed setting.
        strict: Exact matches only.

    Returns:
        The hits.
    """
    return query


def test_schema_types_required_and_descriptions() -> None:
    tool = FunctionTool.from_function(google)
    schema = tool.schema()
    assert schema["type"] == "function"
    fn = schema["function"]
    assert fn["name"] == "google"
    assert fn["description"] == "Search the corpus.\n\nLooks things up in the index."
    params = fn["parameters"]
    assert params["type"] == "object"
    assert params["required"] == ["query"]
    props = params["properties"]
    assert props["query"] == {"type": "string", "description": "What to look for, in plain words."}
    assert props["limit"]["type"] == "integer" and props["limit"]["default"] == 5
    assert props["limit"]["description"] == "Maximum hits."
    assert {"type": "number"} in props["ratio"]["anyOf"]
    assert {"type": "null"} in props["ratio"]["anyOf"]
    assert {"type": "array", "items": {"type": "string"}} in props["tags"]["anyOf"]
    assert props["mode"]["enum"] == ["fast", "slow"]
    assert props["strict"]["type"] == "boolean"
    # pydantic's auto titles are stripped everywhere (they only cost prompt tokens).
    assert "title" not in str(schema)


def test_numpy_and_sphinx_docstrings() -> None:
    def numpy_style(a: int, b: str) -> str:
        """Join things.

        Parameters
        ----------
        a : int
            The count,
            spelled out.
        b : str
            The text.
        """
        return b * a

    def sphinx_style(a: int, b: str) -> str:
        """Join things.

        :param a: The count.
        :param str b: The text,
            continued.
        :returns: the joined text
        """
        return b * a

    for fn in (numpy_style, sphinx_style):
        tool = FunctionTool.from_function(fn)
        assert tool.description == "Join things."
        props = tool.parameters["properties"]
        assert props["a"]["description"].startswith("The count")
        assert props["b"]["description"].startswith("The text")
    assert parse_docstring(numpy_style.__doc__).params["a"] == "The count, spelled out."
    assert parse_docstring(sphinx_style.__doc__).params["b"] == "The text, continued."


def test_parse_docstring_ignores_other_sections_and_empty() -> None:
    parsed = parse_docstring(
        """Summary.

        Raises:
            ValueError: when bad.
        Args:
            x: the x.
        """
    )
    assert parsed.description == "Summary."
    assert parsed.params == {"x": "the x."}
    assert parse_docstring(None).description == ""


def test_nested_model_and_name_overrides() -> None:
    def move(to: Point, label: str = "p") -> str:
        return f"{label}:{to.x},{to.y}"

    tool = FunctionTool.from_function(move, name="move_point", description="Move it.")
    assert tool.name == "move_point" and tool.description == "Move it."
    to_schema = tool.parameters["properties"]["to"]
    assert to_schema == {"$ref": "#/$defs/Point"}
    assert tool.parameters["$defs"]["Point"]["properties"]["x"] == {"type": "integer"}
    assert tool.parameters["required"] == ["to"]


async def test_context_parameter_is_hidden_and_injected() -> None:
    seen: list[ToolContext] = []

    def remember(fact: str, ctx: ToolContext) -> str:
        ctx.state.setdefault("facts", []).append(fact)
        seen.append(ctx)
        return "ok"

    tool = FunctionTool.from_function(remember)
    assert list(tool.parameters["properties"]) == ["fact"]
    assert tool.parameters["required"] == ["fact"]
    context = ToolContext(trajectory_id="t1")
    await tool.call({"fact": "a"}, context)
    await tool.call({"fact": "b"}, context)
    assert context.state["facts"] == ["a", "b"]
    assert seen[0] is context


def test_unsupported_signatures_raise_user_error() -> None:
    def star(*items: int) -> int:
        return sum(items)

    with pytest.raises(UserError, match=r"\*items"):
        FunctionTool.from_function(star)
    with pytest.raises(UserError, match="invalid"):
        FunctionTool.from_function(lambda x: x)

    with pytest.raises(UserError, match="cannot derive a JSON schema for tool 'opaque'"):
        FunctionTool.from_function(opaque)

    class Local:
        pass

    def unresolvable(thing: Local) -> str:  # a string annotation naming a local class
        return "x"

    with pytest.raises(UserError, match=r"cannot read the signature.*'Local'"):
        FunctionTool.from_function(unresolvable)


async def test_validation_errors_name_the_argument() -> None:
    tool = FunctionTool.from_function(google)
    with pytest.raises(ToolArgumentError, match=r"'limit': .*integer.*\(got 'many'\)"):
        await tool.call({"query": "q", "limit": "many"}, ToolContext())
    with pytest.raises(ToolArgumentError, match="'query': missing required argument"):
        await tool.call({}, ToolContext())
    with pytest.raises(ToolArgumentError, match="'colour': unexpected argument"):
        await tool.call({"query": "q", "colour": "red"}, ToolContext())
    with pytest.raises(ToolArgumentError, match=r"'mode'.*'fast' or 'slow'"):
        tool.check_arguments({"query": "q", "mode": "medium"})
    tool.check_arguments({"query": "q", "limit": "3"})  # lax coercion like pydantic's


async def test_validated_values_are_converted_before_the_call() -> None:
    received: list[object] = []

    def take(point: Point, n: int) -> str:
        received.extend([point, n])
        return "ok"

    tool = FunctionTool.from_function(take)
    await tool.call({"point": {"x": 1}, "n": "7"}, ToolContext())
    assert received == [Point(x=1, y=0), 7]


async def test_sync_runs_in_worker_thread_async_in_loop() -> None:
    loop_thread = threading.get_ident()
    threads: dict[str, int] = {}

    @function_tool
    def sync_tool(x: int) -> int:
        threads["sync"] = threading.get_ident()
        return x * 2

    @function_tool
    async def async_tool(x: int) -> int:
        threads["async"] = threading.get_ident()
        return x * 3

    assert (await sync_tool.call({"x": 2}, ToolContext())).text == "4"
    assert (await async_tool.call({"x": 2}, ToolContext())).text == "6"
    assert threads["sync"] != loop_thread
    assert threads["async"] == loop_thread


def test_decorator_with_options_keeps_function_callable() -> None:
    @function_tool(name="double", limits=ToolLimits(timeout=3))
    def twice(x: int) -> int:
        """Double x."""
        return 2 * x

    assert isinstance(twice, FunctionTool)
    assert twice.name == "double" and twice.limits.timeout == 3
    assert twice(21) == 42


@dataclass
class Pair:
    a: int
    b: str


def test_return_values_are_normalized() -> None:
    assert to_tool_result("plain") == ToolResult(text="plain")
    as_dict = to_tool_result({"a": 1, "b": [1, 2]})
    assert as_dict.text == '{"a":1,"b":[1,2]}' and as_dict.structured == {"a": 1, "b": [1, 2]}
    assert to_tool_result([1, 2.5, None]).text == "[1,2.5,null]"
    assert to_tool_result(Point(x=1)).text == '{"x":1,"y":0}'
    assert to_tool_result(Pair(1, "é")).text == '{"a":1,"b":"é"}'
    kept = ToolResult(text="x", is_error=True, reward=1.0)
    assert to_tool_result(kept) is kept
    with pytest.raises(ToolExecutionError, match="cannot be JSON-encoded"):
        to_tool_result(object())


def test_with_schema_overrides_presentation_but_checks_parameters() -> None:
    tool = FunctionTool.from_function(google)
    renamed = tool.with_schema(
        {
            "type": "function",
            "function": {
                "name": "web_search",
                "description": "Search the web.",
                "parameters": {
                    "type": "object",
                    "properties": {"query": {"type": "string"}},
                    "required": ["query"],
                },
            },
        }
    )
    assert renamed.name == "web_search"
    assert renamed.schema()["function"]["description"] == "Search the web."
    assert tool.name == "google"  # the original is untouched (tools are data)
    with pytest.raises(UserError, match="'q' is not a parameter of google"):
        tool.with_schema({"name": "x", "parameters": {"type": "object", "properties": {"q": {}}}})


def test_schema_is_a_copy() -> None:
    tool = FunctionTool.from_function(google)
    tool.schema()["function"]["parameters"]["properties"].clear()
    assert "query" in tool.schema()["function"]["parameters"]["properties"]
