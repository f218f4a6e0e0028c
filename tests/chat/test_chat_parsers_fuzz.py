"""Property tests: no parser raises on any input, and none evaluates anything."""

from __future__ import annotations

import builtins
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolrollout.chat import ParsedTurn
from toolrollout.chat.parsers import get_tool_parser

PARSERS = [
    "hermes",
    "llama3",
    "mistral",
    "pythonic",
    "deepseekv3",
    "deepseekv31",
    "qwen3_coder",
    "kimi_k2",
    "glm45",
    "gpt-oss",
]

FUZZ = settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

FRAGMENTS = [
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "<|python_tag|>",
    "<|python_start|>",
    "<|python_end|>",
    "[TOOL_CALLS]",
    "[ARGS]",
    "[CALL_ID]",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    "```json\n",
    "```",
    "function",
    '{"name": "add", "arguments": {"a": 1}}',
    '{"name": ',
    '"parameters": ',
    "{",
    "}",
    "[",
    "]",
    "(",
    ")",
    ",",
    ";",
    ":",
    '"',
    "'",
    "\\",
    "\n",
    " ",
    "add",
    "a=1",
    "NaN",
    "1e999",
    "9" * 5000,
    "[" * 300,
    "__import__('os')",
    "<|im_end|>",
    "<|eot_id|>",
]

VALID = {
    "hermes": '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": [1, {"c": "d"}]}}\n'
    "</tool_call>",
    "llama3": '<|python_tag|>{"name": "add", "parameters": {"a": 2}}; {"name": "g", '
    '"arguments": {}}',
    "mistral": '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 2}}][TOOL_CALLS]g[ARGS]{"x": 1}',
    "pythonic": "[add(a=2, b='x', c=[1, {'d': None}]), g()]",
    "deepseekv3": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n"
    '{"a": 2}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    "deepseekv31": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>add<｜tool▁sep｜>"
    '{"a": 2}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    "qwen3_coder": "<tool_call>\n<function=add>\n<parameter=a>\n2\n</parameter>\n"
    "<parameter=b>\nx\ny\n</parameter>\n</function>\n</tool_call>",
    "kimi_k2": "<|tool_calls_section_begin|><|tool_call_begin|>functions.add:0"
    '<|tool_call_argument_begin|>{"a": 2}<|tool_call_end|><|tool_calls_section_end|>',
    "glm45": "<tool_call>add\n<arg_key>a</arg_key>\n<arg_value>2</arg_value>\n</tool_call>",
    "gpt-oss": "<|channel|>analysis<|message|>Add them.<|end|><|start|>assistant"
    '<|channel|>commentary to=functions.add <|constrain|>json<|message|>{"a": 2}<|call|>',
}

SENTINEL = "_toolrollout_fuzz_pwned"
DANGEROUS = [
    f"__import__('builtins').setattr(__import__('builtins'), '{SENTINEL}', 1)",
    f"setattr(__builtins__, '{SENTINEL}', 1)",
    f"globals().__setitem__('{SENTINEL}', 1)",
    f'exec("import builtins; builtins.{SENTINEL} = 1")',
    f"eval(\"setattr(__import__('builtins'), '{SENTINEL}', 1)\")",
    f"(lambda: setattr(__import__('builtins'), '{SENTINEL}', 1))()",
    f"[setattr(__import__('builtins'), '{SENTINEL}', 1) for _ in [0]]",
    f"{{'k': __import__('builtins').setattr(__import__('builtins'), '{SENTINEL}', 1)}}",
    "__import__('os').system('false')",
]


def _forbidden(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("a parser called eval/exec")


@contextmanager
def no_eval() -> Iterator[None]:
    """Make eval/exec fail loudly while a parser runs (ast.parse needs compile, kept)."""
    with (
        mock.patch.object(builtins, "eval", _forbidden),
        mock.patch.object(builtins, "exec", _forbidden),
    ):
        yield


def check(name: str, text: str) -> ParsedTurn:
    parser = get_tool_parser(name, id_factory=lambda i: f"c{i}")
    with no_eval():
        turn = parser.parse(text)
    assert isinstance(turn, ParsedTurn)
    assert isinstance(turn.content, str)
    for call in turn.tool_calls:
        assert isinstance(call.name, str) and call.name
        assert isinstance(call.arguments, dict)
        json.dumps(call.arguments, allow_nan=False)  # plain JSON data only
    for error in turn.errors:
        assert isinstance(error.message, str) and error.message
    assert not hasattr(builtins, SENTINEL)
    return turn


soup = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=8)), max_size=24).map(
    "".join
)


@pytest.mark.parametrize("name", PARSERS)
@FUZZ
@given(text=st.text(max_size=300))
def test_arbitrary_text_never_raises(name: str, text: str) -> None:
    check(name, text)


@pytest.mark.parametrize("name", PARSERS)
@FUZZ
@given(text=soup)
def test_format_token_soup_never_raises(name: str, text: str) -> None:
    check(name, text)


@st.composite
def mutated(draw: st.DrawFn, base: str) -> str:
    """Apply a few random edits (delete, insert, duplicate, truncate) to a valid call."""
    text = base
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        op = draw(st.sampled_from(["delete", "insert", "duplicate", "truncate"]))
        i = draw(st.integers(min_value=0, max_value=len(text)))
        j = draw(st.integers(min_value=i, max_value=len(text)))
        if op == "delete":
            text = text[:i] + text[j:]
        elif op == "insert":
            text = (
                text[:i]
                + draw(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=4)))
                + text[i:]
            )
        elif op == "duplicate":
            text = text[:j] + text[i:j] + text[j:]
        else:
            text = text[:j]
    return text


@pytest.mark.parametrize("name", PARSERS)
def test_valid_example_parses(name: str) -> None:
    turn = check(name, VALID[name])
    assert turn.ok and turn.tool_calls


@pytest.mark.parametrize("name", PARSERS)
def test_mutated_valid_calls_never_raise(name: str) -> None:
    @FUZZ
    @given(text=mutated(VALID[name]))
    def run(text: str) -> None:
        check(name, text)

    run()


@FUZZ
@given(
    payload=st.sampled_from(DANGEROUS),
    wrap=st.sampled_from(["[f(x={})]", "[{}]", "[f(a=1, b={})]", "[f(x=[{}])]", "[f(**{})]"]),
    prefix=st.sampled_from(["", "Sure.\n", "<|python_start|>"]),
)
def test_pythonic_payloads_are_never_executed(payload: str, wrap: str, prefix: str) -> None:
    text = prefix + wrap.format(payload)
    turn = check("pythonic", text)  # asserts the sentinel was never set
    # No payload is a literal, so no call is accepted: it is an error, or plain content.
    assert turn.tool_calls == ()
    assert turn.errors or turn.content == text.replace("<|python_start|>", "").strip()


def test_deeply_nested_input_is_an_error_not_a_crash() -> None:
    for name in PARSERS:
        check(name, VALID[name].replace('"a": 2', '"a": ' + "[" * 5000 + "]" * 5000))
    turn = check("pythonic", "[f(a=" + "[" * 3000 + "]" * 3000 + ")]")
    assert turn.errors or turn.tool_calls
