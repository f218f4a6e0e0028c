"""Tool-call parsers: concrete strings for every registered format."""

from __future__ import annotations

import pytest

from toolrollout._exceptions import ModelBehaviorError, ToolParseError, UserError
from toolrollout.chat import ParsedTurn, ToolCall, ToolCallParser, register_tool_parser
from toolrollout.chat.parsers import get_tool_parser, tool_parser_names


def ids(index: int) -> str:
    return f"call_{index}"


def parse(name: str, text: str, **kwargs: object) -> ParsedTurn:
    return get_tool_parser(name, id_factory=ids, **kwargs).parse(text)  # type: ignore[arg-type]


def calls(turn: ParsedTurn) -> list[tuple[str, dict[str, object]]]:
    return [(call.name, call.arguments) for call in turn.tool_calls]


def test_registry() -> None:
    assert set(tool_parser_names()) >= {
        "hermes",
        "qwen25",
        "qwen3",
        "llama3",
        "mistral",
        "pythonic",
        "deepseekv3",
        "deepseekv31",
    }
    with pytest.raises(UserError, match="unknown tool parser"):
        get_tool_parser("nope")


def test_register_custom_parser() -> None:
    class Shout(ToolCallParser):
        name = "shout"

        def parse_body(self, text: str) -> ParsedTurn:
            return ParsedTurn(content=text.upper())

    register_tool_parser("shout-test", Shout)
    assert get_tool_parser("shout-test").parse("hi").content == "HI"
    with pytest.raises(UserError, match="already registered"):
        register_tool_parser("hermes", Shout)


# -- hermes / qwen ------------------------------------------------------------------------

QWEN_ONE = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
QWEN_TWO = (
    "Let me check.\n"
    + QWEN_ONE
    + '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)


@pytest.mark.parametrize("name", ["hermes", "qwen25", "qwen3"])
def test_qwen_single(name: str) -> None:
    turn = parse(name, QWEN_ONE + "<|im_end|>")
    assert turn.ok and turn.content == ""
    assert turn.tool_calls == (ToolCall("call_0", "add", {"a": 2, "b": 3}),)


def test_qwen_multiple_with_text_before_and_after() -> None:
    turn = parse("qwen25", QWEN_TWO + "\nDone.")
    assert calls(turn) == [("add", {"a": 2, "b": 3}), ("get_weather", {"city": "Paris"})]
    assert [c.id for c in turn.tool_calls] == ["call_0", "call_1"]
    assert turn.content == "Let me check.\nDone."


def test_qwen_compact_and_parameters_and_string_arguments() -> None:
    text = (
        '<tool_call>{"name":"add","parameters":{"a":1,"b":1}}</tool_call>'
        '<tool_call>{"name": "add", "arguments": "{\\"a\\": 4, \\"b\\": 4}"}</tool_call>'
        '<tool_call>{"name": "noop"}</tool_call>'
    )
    turn = parse("hermes", text)
    assert turn.ok
    assert calls(turn) == [("add", {"a": 1, "b": 1}), ("add", {"a": 4, "b": 4}), ("noop", {})]


def test_qwen_think_block_is_reasoning_not_calls() -> None:
    text = "<think>\nMaybe <tool_call>{bad}</tool_call>?\n</think>\n\n" + QWEN_ONE
    turn = parse("qwen3", text)
    assert turn.ok and turn.reasoning == "Maybe <tool_call>{bad}</tool_call>?"
    assert calls(turn) == [("add", {"a": 2, "b": 3})]
    opened_by_prompt = parse("qwen3", "thinking...\n</think>\n\n" + QWEN_ONE)
    assert opened_by_prompt.reasoning == "thinking..." and len(opened_by_prompt.tool_calls) == 1


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('<tool_call>\n{"name": "add", "arguments": {"a": 2,}}\n</tool_call>', "invalid JSON"),
        ('<tool_call>\n{"arguments": {"a": 2}}\n</tool_call>', "no 'name'"),
        ('<tool_call>\n{"name": "add", "arguments": [1, 2]}\n</tool_call>', "JSON object"),
        ('<tool_call>\n{"name": "add", "arguments": "a=1"}\n</tool_call>', "not JSON"),
        ('<tool_call>\n"add"\n</tool_call>', "JSON object"),
        ('<tool_call>\n{"name": "add", "arguments": {"a": NaN}}\n</tool_call>', "invalid JSON"),
        ('<tool_call>\n{"name": "add", "arguments": {"a": 1e9992}}\n</tool_call>', "range"),
        ('<tool_call>\n{"name": "add", "arguments": {"a": 2}}', "unterminated"),
    ],
)
def test_qwen_malformed(text: str, message: str) -> None:
    turn = parse("hermes", "Sure.\n" + text)
    assert not turn.ok and turn.tool_calls == ()
    assert len(turn.errors) == 1 and message in turn.errors[0].message
    assert turn.content.startswith("Sure.")


def test_one_bad_call_does_not_hide_the_good_one() -> None:
    text = QWEN_ONE + "\n<tool_call>\n{oops}\n</tool_call>"
    turn = parse("qwen25", text)
    assert len(turn.tool_calls) == 1 and len(turn.errors) == 1
    with pytest.raises(ToolParseError) as info:
        turn.raise_for_errors()
    assert isinstance(info.value, ModelBehaviorError)
    assert info.value.errors == turn.errors


def test_known_tools_are_only_flagged() -> None:
    text = QWEN_ONE + '\n<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'
    turn = parse("qwen25", text, known_tools={"add"})
    assert [c.name for c in turn.tool_calls] == ["add", "rm_rf"]
    assert turn.unknown_tools == ("rm_rf",) and turn.ok
    assert parse("qwen25", text).unknown_tools == ()


def test_default_ids_are_unique() -> None:
    turn = get_tool_parser("qwen25").parse(QWEN_TWO)
    first, second = (c.id for c in turn.tool_calls)
    assert first != second and first.startswith("call_")


def test_tool_call_to_dict_rerenders_as_object() -> None:
    call = ToolCall("call_0", "add", {"a": 1})
    assert call.to_dict() == {
        "id": "call_0",
        "type": "function",
        "function": {"name": "add", "arguments": {"a": 1}},
    }


# -- llama3 ---------------------------------------------------------------------------------


def test_llama3_bare_json() -> None:
    turn = parse("llama3", '{"name": "add", "parameters": {"a": 2, "b": 3}}<|eot_id|>')
    assert turn.ok and calls(turn) == [("add", {"a": 2, "b": 3})] and turn.content == ""


def test_llama3_python_tag_multiple_and_text() -> None:
    text = (
        "Checking both.<|python_tag|>"
        '{"name": "add", "arguments": {"a": 1, "b": 2}}; '
        '{"name": "get_weather", "parameters": {"city": "Oslo"}}<|eom_id|>'
    )
    turn = parse("llama3", text)
    assert turn.ok
    assert calls(turn) == [("add", {"a": 1, "b": 2}), ("get_weather", {"city": "Oslo"})]
    assert turn.content == "Checking both."


def test_llama3_plain_answers_are_content() -> None:
    assert parse("llama3", "The answer is 5.").tool_calls == ()
    json_answer = parse("llama3", '{"answer": 5}')
    assert (
        json_answer.ok and json_answer.tool_calls == () and json_answer.content == '{"answer": 5}'
    )


def test_llama3_trailing_text_after_calls_is_content() -> None:
    turn = parse("llama3", '{"name": "add", "parameters": {"a": 1}} and then some words')
    assert calls(turn) == [("add", {"a": 1})] and turn.content == "and then some words"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('<|python_tag|>{"name": "add", "parameters": {"a": }', "invalid JSON"),
        ('{"name": "add", "parameters": {"a": 1}', "invalid JSON"),
        ('<|python_tag|>{"parameters": {"a": 1}}', "no 'name'"),
        ('<|python_tag|>{"name": "add", "parameters": 3}', "JSON object"),
        ("<|python_tag|>", "not followed by a tool call"),
        ('<|python_tag|>{"name": "a", "parameters": {}}; {"name": ', "invalid JSON"),
    ],
)
def test_llama3_malformed(text: str, message: str) -> None:
    turn = parse("llama3", text)
    assert turn.errors and message in turn.errors[-1].message


# -- mistral ----------------------------------------------------------------------------------


def test_mistral_json_array() -> None:
    text = (
        'Sure. [TOOL_CALLS] [{"name": "add", "arguments": {"a": 2, "b": 3}}, '
        '{"name": "get_weather", "arguments": {"city": "Rome"}}]</s>'
    )
    turn = parse("mistral", text)
    assert turn.ok and turn.content == "Sure."
    assert calls(turn) == [("add", {"a": 2, "b": 3}), ("get_weather", {"city": "Rome"})]


def test_mistral_compact_repeated_with_call_id() -> None:
    text = (
        '[TOOL_CALLS]add[ARGS]{"a": 2, "b": 3}'
        '[TOOL_CALLS]get_weather[CALL_ID]abc123XYZ[ARGS]{"city": "Rome"} trailing'
    )
    turn = parse("mistral", text)
    assert turn.ok
    assert calls(turn) == [("add", {"a": 2, "b": 3}), ("get_weather", {"city": "Rome"})]
    assert [c.id for c in turn.tool_calls] == ["call_0", "abc123XYZ"]
    assert turn.content == "trailing"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[TOOL_CALLS] [{"name": "add", "arguments": {"a": 2}]', "invalid JSON"),
        ("[TOOL_CALLS]add{}", "expected"),
        ('[TOOL_CALLS]add[ARGS]{"a": }', "invalid JSON"),
        ("[TOOL_CALLS]add[ARGS][1, 2]", "JSON object"),
        ('[TOOL_CALLS]my tool[ARGS]{"a": 1}', "invalid tool name"),
        ('[TOOL_CALLS] [{"arguments": {}}]', "no 'name'"),
    ],
)
def test_mistral_malformed(text: str, message: str) -> None:
    turn = parse("mistral", text)
    assert turn.errors and message in turn.errors[0].message and turn.tool_calls == ()


def test_mistral_plain_text() -> None:
    assert parse("mistral", "No tools needed.").content == "No tools needed."


# -- pythonic ---------------------------------------------------------------------------------


def test_pythonic_single_and_multiple() -> None:
    turn = parse("pythonic", '[add(a=2, b=3), get_weather(city="Paris"), now()]')
    assert turn.ok and turn.content == ""
    assert calls(turn) == [
        ("add", {"a": 2, "b": 3}),
        ("get_weather", {"city": "Paris"}),
        ("now", {}),
    ]


def test_pythonic_literals_and_wrappers() -> None:
    text = (
        "<|python_start|>[search(q='x', tags=('a', 'b'), opts={'k': [1, 2.5, None, True]}, "
        "n=-3)]<|python_end|>"
    )
    turn = parse("pythonic", text)
    assert turn.ok
    assert calls(turn) == [
        ("search", {"q": "x", "tags": ["a", "b"], "opts": {"k": [1, 2.5, None, True]}, "n": -3})
    ]


def test_pythonic_text_before_and_after() -> None:
    text = 'Let me look.\n[get_weather(city="a]b")]\nThat is all.'
    turn = parse("pythonic", text)
    assert calls(turn) == [("get_weather", {"city": "a]b"})]
    assert turn.content == "Let me look.\nThat is all."


def test_pythonic_plain_text_has_no_calls() -> None:
    for text in ["The answer is [5].", "see [1](link)", "a list: [x for x in y]"]:
        turn = parse("pythonic", text)
        assert turn.ok and turn.tool_calls == ()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[add(2, 3)]", "positional"),
        ("[add(**kw)]", "**kwargs"),
        ("[add(a=x)]", "not a literal"),
        ("[add(a=1 + 2j)]", "no JSON form"),
        ("[add(a={1, 2})]", "no JSON form"),
        ("[add(a={1: 2})]", "no JSON form"),
        ("[add(a=1), 5]", "must be a call"),
        ("[f(a=1), g()(b=2)]", "plain (dotted) name"),
        ("[add(a=1", "could not parse"),
        ("[add(a=1,,)]", "could not parse"),
    ],
)
def test_pythonic_malformed(text: str, message: str) -> None:
    turn = parse("pythonic", text)
    assert turn.errors and message in turn.errors[-1].message


def test_pythonic_never_executes(tmp_path: object) -> None:
    from pathlib import Path

    sentinel = Path(str(tmp_path)) / "pwned"
    payloads = [
        f"[f(x=__import__('os').system('touch {sentinel}'))]",
        f"[f(x=open('{sentinel}', 'w').write('x'))]",
        f"[__import__('os').system('touch {sentinel}')]",
        f"[f(x=(lambda: open('{sentinel}', 'w'))())]",
        f"[f(x=[open('{sentinel}', 'w') for _ in [1]])]",
        f"[f(x=exec(\"open('{sentinel}', 'w')\"))]",
    ]
    for payload in payloads:
        turn = parse("pythonic", payload)
        assert turn.tool_calls == () or all(
            "open" not in repr(c.arguments) for c in turn.tool_calls
        )
        assert not sentinel.exists()
    assert parse("pythonic", payloads[0]).errors


# -- deepseek -------------------------------------------------------------------------------

B, E = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CB, CE, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"


def test_deepseekv3_two_calls() -> None:
    text = (
        f"Checking.{B}{CB}function{SEP}add\n```json\n"
        '{"a": 2, "b": 3}\n```'
        f"{CE}\n{CB}function{SEP}get_weather\n```json\n"
        '{"city": "Tokyo"}\n```'
        f"{CE}{E}<｜end▁of▁sentence｜>"
    )
    turn = parse("deepseekv3", text)
    assert turn.ok and turn.content == "Checking."
    assert calls(turn) == [("add", {"a": 2, "b": 3}), ("get_weather", {"city": "Tokyo"})]


def test_deepseekv31_unfenced() -> None:
    text = f'{B}{CB}add{SEP}{{"a": 1, "b": 1}}{CE}{E} ok'
    turn = parse("deepseekv31", text)
    assert turn.ok and calls(turn) == [("add", {"a": 1, "b": 1})] and turn.content == "ok"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f'{B}{CB}function{SEP}add\n```json\n{{"a": }}\n```{CE}{E}', "invalid JSON"),
        (f'{B}{CB}function{SEP}add\n{{"a": 1}}{CE}{E}', "fence"),
        (f'{B}{CB}function add\n```json\n{{"a": 1}}\n```{CE}{E}', "has no"),
        (f'{B}{CB}function{SEP}add\n```json\n{{"a": 1}}\n```{E}', "unterminated"),
        (f"{B}{E}", "no call"),
        (f"{B}{CB}function{SEP}add\n```json\n[1]\n```{CE}{E}", "JSON object"),
    ],
)
def test_deepseekv3_malformed(text: str, message: str) -> None:
    turn = parse("deepseekv3", text)
    assert turn.errors and message in turn.errors[0].message and turn.tool_calls == ()


def test_plain_text_everywhere() -> None:
    for name in tool_parser_names():
        if name == "shout-test":
            continue
        turn = parse(name, "Just an answer.<|im_end|>")
        assert turn.content == "Just an answer." and turn.ok and turn.tool_calls == ()
