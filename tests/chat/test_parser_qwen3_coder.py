"""The ``qwen3_coder`` parser: Qwen3-Coder's XML calls, values typed by the tool schema.

Expected values follow SGLang's ``Qwen3CoderDetector`` (the serving parser this format is
named after) except where the module docstring documents a stricter rule. The round-trip
tests parse what the official Qwen3-Coder template renders, so the format is checked
against the model's own template, not against this parser's idea of it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import PreTrainedTokenizerBase

from toolrollout.chat import ParsedTurn, ToolCall
from toolrollout.chat.parsers import get_tool_parser

OFFICIAL = Path(__file__).parent / "templates" / "official"

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "edit",
            "description": "Replace text in a file.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "text": {"type": "string"},
                    "ratio": {"type": "number"},
                    "force": {"type": "boolean"},
                    "options": {"type": "object"},
                    "lines": {"type": "array", "items": {"type": "integer"}},
                    "limit": {"type": ["integer", "null"]},
                },
                "required": ["path", "text"],
            },
        },
    },
]


def ids(index: int) -> str:
    return f"call_{index}"


def parse(text: str, tools: list[dict[str, Any]] | None = TOOLS) -> ParsedTurn:
    return get_tool_parser("qwen3_coder", id_factory=ids, tools=tools).parse(text)


def call(name: str, **params: str) -> str:
    body = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def test_registered_under_sglangs_name() -> None:
    assert type(get_tool_parser("qwen3_coder")).__name__ == "Qwen3CoderParser"


def test_one_call_typed_by_schema() -> None:
    turn = parse(call("add", a="2", b="-3") + "<|im_end|>")
    assert turn.ok and turn.content == ""
    assert turn.tool_calls == (ToolCall("call_0", "add", {"a": 2, "b": -3}),)


def test_multi_line_value_keeps_its_inner_newlines() -> None:
    text = "def f():\n    return 1\n\n"
    turn = parse(call("edit", path="a.py", text=text))
    assert turn.ok
    # One newline after the open tag and one before the close tag are markup; the value's
    # own trailing blank line survives.
    assert turn.tool_calls[0].arguments == {"path": "a.py", "text": text}


def test_parallel_calls_and_content_before() -> None:
    turn = parse(
        "I will add twice.\n" + call("add", a="1", b="2") + "\n" + call("add", a="3", b="4")
    )
    assert turn.ok
    assert [c.arguments for c in turn.tool_calls] == [{"a": 1, "b": 2}, {"a": 3, "b": 4}]
    assert [c.id for c in turn.tool_calls] == ["call_0", "call_1"]
    assert turn.content == "I will add twice."


def test_two_functions_in_one_block() -> None:
    text = (
        "<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n</function>\n"
        "<function=add>\n<parameter=a>\n2\n</parameter>\n</function>\n</tool_call>"
    )
    turn = parse(text)
    assert turn.ok and [c.arguments for c in turn.tool_calls] == [{"a": 1}, {"a": 2}]


@pytest.mark.parametrize(
    ("param", "text", "expected"),
    [
        ("ratio", "0.5", 0.5),
        ("ratio", "3", 3),
        ("ratio", "1e3", 1000.0),
        ("force", "true", True),
        ("force", "False", False),
        ("options", '{"mode": "fast", "depth": [1, 2]}', {"mode": "fast", "depth": [1, 2]}),
        ("lines", "[3, 5]", [3, 5]),
        ("limit", "7", 7),
        ("limit", "null", None),
        ("path", "null", None),
        ("path", "  spaced  ", "  spaced  "),
        ("path", "42", "42"),
    ],
)
def test_value_conversion(param: str, text: str, expected: object) -> None:
    turn = parse(call("edit", **{param: text}))
    assert turn.ok
    value = turn.tool_calls[0].arguments[param]
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize(
    ("param", "text"),
    [("ratio", "fast"), ("force", "yes"), ("options", "{not json"), ("lines", "3, 5")],
)
def test_value_that_does_not_fit_its_type_stays_text(param: str, text: str) -> None:
    # SGLang keeps such values as strings too (except booleans, which it turns into False);
    # the tool's argument check then tells the model.
    turn = parse(call("edit", **{param: text}))
    assert turn.ok and turn.tool_calls[0].arguments == {param: text}


def test_integer_that_is_not_an_integer_stays_text() -> None:
    turn = parse(call("add", a="2.5", b="x"))
    assert turn.tool_calls[0].arguments == {"a": "2.5", "b": "x"}


def test_without_schemas_every_value_is_text() -> None:
    turn = parse(call("add", a="2", b="3"), tools=None)
    assert turn.tool_calls[0].arguments == {"a": "2", "b": "3"}
    turn = parse(call("unknown_tool", a="2"))
    assert turn.ok and turn.tool_calls[0].arguments == {"a": "2"}


def test_call_without_parameters() -> None:
    turn = parse("<tool_call>\n<function=now>\n</function>\n</tool_call>")
    assert turn.ok and turn.tool_calls == (ToolCall("call_0", "now", {}),)


def test_think_block_is_reasoning() -> None:
    turn = parse("<think>\nAdd them.\n</think>\n\n" + call("add", a="1", b="1"))
    assert turn.reasoning == "Add them." and turn.ok and len(turn.tool_calls) == 1


def test_plain_text_is_content() -> None:
    turn = parse("The answer is 5.<|im_end|>")
    assert turn == ParsedTurn(content="The answer is 5.")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n</function>\n",
            "unterminated <tool_call>",
        ),
        (
            "<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n</tool_call>",
            "unterminated <function=add>",
        ),
        (
            "<tool_call>\n<function=add>\n<parameter=a>\n1\n</function>\n</tool_call>",
            "not closed with </parameter>",
        ),
        ("<tool_call>\n</tool_call>", "expected <function=NAME>"),
        ('<tool_call>\n{"name": "add", "arguments": {}}\n</tool_call>', "expected <function=NAME>"),
        (
            "<tool_call>\nsure\n<function=add>\n</function>\n</tool_call>",
            "unexpected text before <function",
        ),
        (
            "<tool_call>\n<function=add>\nhello\n</function>\n</tool_call>",
            "unexpected text in the call",
        ),
        ("<tool_call>\n<function=>\n</function>\n</tool_call>", "has no tool name"),
        (
            "<tool_call>\n<function=add>\n<parameter=>\n1\n</parameter>\n</function>\n</tool_call>",
            "has no name",
        ),
        (
            call("add", a="1").replace(
                "</function>", "<parameter=a>\n2\n</parameter>\n</function>"
            ),
            "appears twice",
        ),
        (
            "<function=add>\n<parameter=a>\n1\n</parameter>\n</function>",
            "must be inside <tool_call>",
        ),
    ],
)
def test_malformed_calls_are_errors(text: str, message: str) -> None:
    turn = parse(text)
    assert not turn.ok and not turn.tool_calls
    assert len(turn.errors) == 1 and message in turn.errors[0].message


def test_good_call_next_to_a_bad_one() -> None:
    bad = "<tool_call>\n<function=add>\n<parameter=a>\n1\n</function>\n</tool_call>"
    turn = parse(call("add", a="1", b="2") + "\n" + bad)
    assert len(turn.tool_calls) == 1 and len(turn.errors) == 1


# -- against the official template, rendered by transformers --------------------------------


@pytest.mark.parametrize("file", ["Qwen3-Coder.jinja", "Qwen3-Coder-llamacpp-2026.jinja"])
def test_parses_what_the_official_template_writes(
    file: str, qwen25_tokenizer: PreTrainedTokenizerBase
) -> None:
    arguments = [
        {"a": 2, "b": 40},
        {
            "path": "src/app.py",
            "text": "line one\n  line two\n",
            "ratio": 0.25,
            "options": {"mode": "fast", "depth": [1, 2]},
            "lines": [3, 5],
        },
    ]
    calls = [
        {"type": "function", "function": {"name": name, "arguments": args}}
        for name, args in zip(["add", "edit"], arguments, strict=True)
    ]
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "Two calls.", "tool_calls": calls},
    ]
    rendered = qwen25_tokenizer.apply_chat_template(
        messages,
        tools=list[Any](TOOLS),
        chat_template=(OFFICIAL / file).read_text(),
        tokenize=False,
    )
    assert isinstance(rendered, str)
    turn_text = rendered.split("<|im_start|>assistant", 1)[1].split("<|im_end|>", 1)[0]
    turn = parse(turn_text)
    assert turn.ok and turn.content == "Two calls."
    assert [c.name for c in turn.tool_calls] == ["add", "edit"]
    assert [c.arguments for c in turn.tool_calls] == arguments


# -- robustness ----------------------------------------------------------------------------

FRAGMENTS = [
    "<tool_call>",
    "</tool_call>",
    "<function=add>",
    "<function=",
    "</function>",
    "<parameter=a>",
    "<parameter=",
    "</parameter>",
    "<think>",
    "</think>",
    ">",
    "\n",
    "1",
    "null",
    "{",
    "}",
    "[",
    "]",
    '"',
    "x",
]


@settings(
    max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=4), max_size=30))
def test_never_raises(parts: list[str]) -> None:
    turn = parse("".join(parts))
    assert isinstance(turn, ParsedTurn)
    for tool_call in turn.tool_calls:
        json.dumps(tool_call.arguments)
