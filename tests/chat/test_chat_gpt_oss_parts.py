"""gpt-oss (harmony): the parser, the history rule and the message builder, piece by piece.

The rendered side of every check comes from the official template
(``templates/official/openai-gpt-oss-120b.jinja``), never from strings written here.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.chat.conftest import TOOLS, build_tokenizer
from transformers import PreTrainedTokenizerBase

from toolrollout.chat import ChatFormat, ParsedTurn, ToolCall
from toolrollout.chat.families import get_template_family
from toolrollout.chat.families._family import TemplateProbe
from toolrollout.chat.families._gpt_oss import (
    detect_harmony,
    harmony_assistant_message,
    harmony_history,
)
from toolrollout.chat.parsers import get_tool_parser

OFFICIAL = Path(__file__).parent / "templates" / "official"
TEMPLATE_FILE = OFFICIAL / "openai-gpt-oss-120b.jinja"
TEMPLATE_SHA256 = "a4c9919cbbd4acdd51ccffe22da049264b1b73e59055fa58811a99efbd7c8146"
HARMONY_SPECIAL = [
    "<|endoftext|>",
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|constrain|>",
    "<|call|>",
    "<|return|>",
]

# What gpt-oss writes: the recipient in the channel part, <|constrain|>json, compact JSON.
ANALYSIS = "<|channel|>analysis<|message|>I need the sum first.<|end|>"
CALL_ADD = (
    "<|start|>assistant<|channel|>commentary to=functions.add <|constrain|>json"
    '<|message|>{"a":2,"b":3}<|call|>'
)
FINAL = (
    "<|channel|>analysis<|message|>Now answer.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>It is 5.<|return|>"
)


def ids(index: int) -> str:
    return f"call_{index}"


def parse(text: str) -> ParsedTurn:
    return get_tool_parser("gpt-oss", id_factory=ids).parse(text)


@pytest.fixture(scope="module")
def harmony() -> PreTrainedTokenizerBase:
    return build_tokenizer(
        special=HARMONY_SPECIAL,
        added=[],
        template=TEMPLATE_FILE.read_text(encoding="utf-8"),
        eos="<|return|>",
    )


def render(tok: PreTrainedTokenizerBase, messages: list[dict[str, Any]], gen: bool) -> str:
    tools: list[Any] = list(TOOLS)
    text = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=gen)
    assert isinstance(text, str)
    return text


def test_vendored_template_is_byte_identical() -> None:
    data = TEMPLATE_FILE.read_bytes()
    assert hashlib.sha256(data).hexdigest() == TEMPLATE_SHA256
    provenance = (OFFICIAL / "PROVENANCE.md").read_text(encoding="utf-8")
    line = next(row for row in provenance.splitlines() if TEMPLATE_FILE.name in row)
    assert TEMPLATE_SHA256 in line and "1eeb523c3e0c7ffbd59469f5463dcbdecba3535e" in line


# -- parser ---------------------------------------------------------------------------------


def test_analysis_then_call() -> None:
    turn = parse(ANALYSIS + CALL_ADD)
    assert turn.ok and turn.content == ""
    assert turn.reasoning == "I need the sum first."
    assert turn.tool_calls == (ToolCall("call_0", "add", {"a": 2, "b": 3}),)


def test_call_as_the_template_renders_it() -> None:
    """The recipient in the role part and a bare ``json`` (the template's spelling)."""
    text = ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Oslo"}'
    turn = parse(text + "<|call|>")
    assert turn.ok and turn.tool_calls == (ToolCall("call_0", "get_weather", {"city": "Oslo"}),)


def test_final_answer_keeps_text_verbatim() -> None:
    turn = parse(
        "<|channel|>analysis<|message|> think \n<|end|><|start|>assistant"
        "<|channel|>final<|message|>  Line 1\nLine 2 \n"
    )
    assert turn.ok and turn.tool_calls == ()
    assert turn.reasoning == " think \n" and turn.content == "  Line 1\nLine 2 \n"


def test_preamble_and_plain_text_are_content() -> None:
    assert parse("<|channel|>commentary<|message|>Checking.<|end|>").content == "Checking."
    plain = parse("no harmony here")
    assert plain.ok and plain.content == "no harmony here" and plain.reasoning is None


def test_missing_end_closes_the_message_at_the_next_channel() -> None:
    turn = parse("<|channel|>analysis<|message|>hmm<|channel|>final<|message|>Done.")
    assert turn.reasoning == "hmm" and turn.content == "Done."


def test_think_tags_are_not_reasoning_here() -> None:
    turn = parse("<|channel|>final<|message|><think>x</think> y")
    assert turn.reasoning is None and turn.content == "<think>x</think> y"


def test_other_namespaces_keep_their_name() -> None:
    text = '<|channel|>commentary to=browser.search <|constrain|>json<|message|>{"query": "q"}'
    turn = get_tool_parser("gpt-oss", known_tools={"add"}).parse(text)
    assert [c.name for c in turn.tool_calls] == ["browser.search"]
    assert turn.unknown_tools == ("browser.search",)


def test_empty_arguments_are_an_empty_object() -> None:
    turn = parse("<|channel|>commentary to=functions.ping <|constrain|>json<|message|><|call|>")
    assert turn.ok and turn.tool_calls == (ToolCall("call_0", "ping", {}),)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '<|channel|>commentary to=functions.add <|constrain|>json<|message|>{"a": 2,',
            "invalid JSON",
        ),
        (
            "<|channel|>commentary to=functions.add <|constrain|>json<|message|>[1, 2]",
            "JSON object",
        ),
        (
            '<|channel|>commentary to=functions.add <|constrain|>json<|message|>{"a": NaN}',
            "invalid JSON",
        ),
        ('<|channel|>commentary <|constrain|>json<|message|>{"a": 1}', "no recipient"),
        ("<|channel|>commentary to=functions.add <|constrain|>json", "never started"),
        ("<|channel|>commentary to=functions.add <|constrain|>yaml<|message|>a: 1", "content type"),
        ("<|channel|>commentary to=functions. <|constrain|>json<|message|>{}", "names no tool"),
        (
            "<|channel|>commentary to=functions.add <|constrain|>json<|message|>{}<|end|>",
            "not <|call|>",
        ),
    ],
)
def test_malformed_calls_are_errors(text: str, message: str) -> None:
    turn = parse(ANALYSIS + "<|start|>assistant" + text)
    assert turn.tool_calls == () and len(turn.errors) == 1
    assert message in turn.errors[0].message
    assert turn.reasoning == "I need the sum first." and turn.content == ""


FRAGMENTS = [
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|constrain|>",
    "<|call|>",
    "<|return|>",
    "assistant",
    "analysis",
    "commentary",
    "final",
    " to=functions.add",
    "to=",
    " json",
    "json",
    '{"a": 1}',
    "{",
    "}",
    "[",
    '"',
    " ",
    "\n",
    "x",
]


@settings(
    max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=30).map("".join))
def test_token_soup_never_raises(text: str) -> None:
    turn = parse(text)
    assert isinstance(turn.content, str)
    message = message_of(text, turn)
    assert message["raw_content"] == text
    assert len(message.get("tool_calls", [])) == len(turn.tool_calls) + len(turn.errors)
    harmony_history(text)


FAMILY = get_template_family("gpt_oss")


def message_of(text: str, turn: ParsedTurn) -> dict[str, Any]:
    return harmony_assistant_message(text, turn, FAMILY, [c.id for c in turn.tool_calls])


# -- messages and the history rule, against the official template --------------------------


def conversation(texts: list[str]) -> list[dict[str, Any]]:
    """A user question, then each model turn's message, each call answered by its tool."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 2 + 3?"}]
    for text in texts:
        stripped = text.removesuffix("<|call|>").removesuffix("<|return|>")
        message = message_of(stripped, parse(stripped))
        message.pop("raw_content")
        messages.append(message)
        if message.get("tool_calls"):
            messages.append({"role": "tool", "content": "5\n(exact)"})
    return messages


def test_messages_rerender_and_differ_only_by_the_history_rule(
    harmony: PreTrainedTokenizerBase,
) -> None:
    prompt = render(harmony, conversation([])[:1], gen=True)
    texts = [ANALYSIS + CALL_ADD, FINAL]
    messages = conversation(texts)
    tool_turn = render(harmony, messages[:3], gen=True)[
        len(render(harmony, messages[:2], gen=False)) :
    ]
    transcript = prompt + texts[0] + tool_turn + texts[1]
    fresh = render(harmony, messages, gen=False)
    assert transcript != fresh  # analysis dropped, header respelled, JSON respaced
    assert harmony_history(transcript) == harmony_history(fresh)
    assert messages[1]["thinking"] == "I need the sum first." and messages[1]["content"] == ""
    assert messages[3] == {"role": "assistant", "content": "It is 5.", "thinking": "Now answer."}


def test_history_rule_still_sees_real_differences(harmony: PreTrainedTokenizerBase) -> None:
    messages = conversation([ANALYSIS + CALL_ADD, FINAL])
    fresh = render(harmony, messages, gen=False)
    wrong_args = json.loads(json.dumps(messages))
    wrong_args[1]["tool_calls"][0]["function"]["arguments"] = {"a": 2, "b": 4}
    as_string = json.loads(json.dumps(messages))
    as_string[1]["tool_calls"][0]["function"]["arguments"] = '{"a": 2, "b": 3}'
    wrong_answer = json.loads(json.dumps(messages))
    wrong_answer[3]["content"] = "It is 6."
    broken_string = json.loads(json.dumps(messages))
    broken_string[1]["tool_calls"][0]["function"]["arguments"] = '{"a": 2, "b": 3'
    for changed in (wrong_args, as_string, wrong_answer, broken_string):
        other = render(harmony, changed, gen=False)
        assert harmony_history(other) != harmony_history(fresh)


def test_canonical_model_text_is_token_exact_while_the_tool_loop_runs(
    harmony: PreTrainedTokenizerBase,
) -> None:
    """Before a final answer exists the template keeps each call turn's analysis."""
    canonical = (
        "<|channel|>analysis<|message|>Sum first.<|end|><|start|>assistant to=functions.add"
        '<|channel|>commentary json<|message|>{"a": 2, "b": 3}<|call|>'
    )
    messages = conversation([canonical])
    transcript = render(harmony, messages[:1], gen=True) + canonical
    assert render(harmony, messages[:2], gen=False) == transcript


def test_malformed_call_keeps_a_call_so_its_error_answer_renders(
    harmony: PreTrainedTokenizerBase,
) -> None:
    bad = (
        ANALYSIS
        + "<|start|>assistant<|channel|>commentary to=functions.add <|constrain|>json"
        + '<|message|>{"a": 2,'
    )
    turn = parse(bad)
    message = message_of(bad, turn)
    assert turn.errors and message["tool_calls"][0]["function"] == {
        "name": "add",
        "arguments": '{"a": 2,',
    }
    message.pop("raw_content")
    error = {"role": "tool", "content": "Error: could not parse tool call: invalid JSON"}
    text = render(harmony, [{"role": "user", "content": "hi"}, message, error], gen=True)
    assert "<|start|>functions.add to=assistant<|channel|>commentary<|message|>" in text


def test_detection_reads_the_render() -> None:
    template = TEMPLATE_FILE.read_text(encoding="utf-8")
    rendered = "<|start|>assistant to=functions.add<|channel|>commentary json<|message|>{}<|call|>"
    assert detect_harmony(TemplateProbe(template=template, rendered=rendered, error=None))
    assert detect_harmony(TemplateProbe(template=template, rendered=None, error="boom"))
    qwen = "<|im_start|>assistant\n<tool_call>\n{}\n</tool_call><|im_end|>"
    assert not detect_harmony(TemplateProbe(template="{{ x }}", rendered=qwen, error=None))


def test_chat_format_detects_gpt_oss_and_no_other_template(
    harmony: PreTrainedTokenizerBase,
    qwen25_tokenizer: PreTrainedTokenizerBase,
    qwen3_tokenizer: PreTrainedTokenizerBase,
    llama3_tokenizer: PreTrainedTokenizerBase,
) -> None:
    assert ChatFormat(harmony, tools=TOOLS).family.name == "gpt_oss"
    for other in (qwen25_tokenizer, qwen3_tokenizer, llama3_tokenizer):
        assert ChatFormat(other, tools=TOOLS).family.name != "gpt_oss"
