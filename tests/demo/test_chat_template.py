"""The demo chat template renders the Qwen2.5 tool-calling format, byte for byte."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from tokenizers import Tokenizer
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from toolrollout.apps.demo import DEMO_CHAT_TEMPLATE_PATH, DEMO_MODEL_PATH
from toolrollout.tools.calculator import CALCULATOR_TOOL

SYSTEM = "You are a helpful assistant."
OTHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "echo",
        "description": "Repeat the text.",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
    },
}


def system_turn(system: str, tools: list[dict[str, Any]]) -> str:
    lines = "".join("\n" + json.dumps(t) for t in tools)
    return (
        f"<|im_start|>system\n{system}\n\n# Tools\n\n"
        "You can call the tools described below, one JSON schema per line:\n"
        f"<tools>{lines}\n</tools>\n\n"
        "To call a tool, write a JSON object with its name and arguments between tags:\n"
        '<tool_call>\n{"name": <tool-name>, "arguments": <args-object>}\n</tool_call>'
        "<|im_end|>\n"
    )


def call(expression: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": "calculator", "arguments": {"expression": expression}},
    }


CALL_37 = (
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "37 * 12"}}\n</tool_call>'
)
CALL_81 = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "81 - 9"}}\n</tool_call>'
USER: list[dict[str, Any]] = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "What is 37 * 12?"},
]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(DEMO_MODEL_PATH)


def render(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    tools: list[dict[Any, Any] | Callable[..., Any]] | None = None,
    add_generation_prompt: bool = False,
) -> str:
    text = tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False
    )
    assert isinstance(text, str)
    return text


def test_shipped_template_is_the_source_file(tokenizer: PreTrainedTokenizerBase) -> None:
    source = DEMO_CHAT_TEMPLATE_PATH.read_text(encoding="utf-8")
    assert tokenizer.chat_template == source
    config = json.loads((DEMO_MODEL_PATH / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["chat_template"] == source
    assert (DEMO_MODEL_PATH / "chat_template.jinja").read_text(encoding="utf-8") == source


def test_system_and_user_with_tools(tokenizer: PreTrainedTokenizerBase) -> None:
    text = render(tokenizer, USER, [CALCULATOR_TOOL, OTHER_TOOL], add_generation_prompt=True)
    assert text == (
        system_turn(SYSTEM, [CALCULATOR_TOOL, OTHER_TOOL])
        + "<|im_start|>user\nWhat is 37 * 12?<|im_end|>\n"
        + "<|im_start|>assistant\n"
    )


def test_default_system_text_when_tools_but_no_system(tokenizer: PreTrainedTokenizerBase) -> None:
    text = render(tokenizer, USER[1:], [CALCULATOR_TOOL])
    assert text == (
        system_turn(SYSTEM, [CALCULATOR_TOOL]) + "<|im_start|>user\nWhat is 37 * 12?<|im_end|>\n"
    )


def test_without_tools(tokenizer: PreTrainedTokenizerBase) -> None:
    assert render(tokenizer, USER) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat is 37 * 12?<|im_end|>\n"
    )
    assert render(tokenizer, USER[1:], add_generation_prompt=True) == (
        "<|im_start|>user\nWhat is 37 * 12?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_assistant_with_one_tool_call(tokenizer: PreTrainedTokenizerBase) -> None:
    messages = [*USER, {"role": "assistant", "content": "", "tool_calls": [call("37 * 12")]}]
    text = render(tokenizer, messages, [CALCULATOR_TOOL])
    assert text.endswith(
        "<|im_start|>user\nWhat is 37 * 12?<|im_end|>\n"
        f"<|im_start|>assistant\n{CALL_37}<|im_end|>\n"
    )


def test_assistant_with_content_and_two_tool_calls(tokenizer: PreTrainedTokenizerBase) -> None:
    messages = [
        *USER,
        {
            "role": "assistant",
            "content": "Two calls.",
            "tool_calls": [call("37 * 12"), call("81 - 9")],
        },
    ]
    text = render(tokenizer, messages, [CALCULATOR_TOOL])
    assert text.endswith(f"<|im_start|>assistant\nTwo calls.\n{CALL_37}\n{CALL_81}<|im_end|>\n")


def test_consecutive_tool_messages_are_one_user_turn(tokenizer: PreTrainedTokenizerBase) -> None:
    messages = [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [call("37 * 12"), call("81 - 9")]},
        {"role": "tool", "content": "444"},
        {"role": "tool", "content": "72"},
        {"role": "assistant", "content": "444 and 72."},
        {"role": "user", "content": "And 1 + 1?"},
        {"role": "assistant", "content": None, "tool_calls": [call("1 + 1")]},
        {"role": "tool", "content": "2"},
    ]
    text = render(tokenizer, messages, [CALCULATOR_TOOL], add_generation_prompt=True)
    assert text == (
        system_turn(SYSTEM, [CALCULATOR_TOOL])
        + "<|im_start|>user\nWhat is 37 * 12?<|im_end|>\n"
        + f"<|im_start|>assistant\n{CALL_37}\n{CALL_81}<|im_end|>\n"
        + "<|im_start|>user\n<tool_response>\n444\n</tool_response>"
        + "\n<tool_response>\n72\n</tool_response><|im_end|>\n"
        + "<|im_start|>assistant\n444 and 72.<|im_end|>\n"
        + "<|im_start|>user\nAnd 1 + 1?<|im_end|>\n"
        + "<|im_start|>assistant\n<tool_call>\n"
        + '{"name": "calculator", "arguments": {"expression": "1 + 1"}}\n</tool_call><|im_end|>\n'
        + "<|im_start|>user\n<tool_response>\n2\n</tool_response><|im_end|>\n"
        + "<|im_start|>assistant\n"
    )


def test_arguments_as_json_string_are_inserted_verbatim(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    raw = '{"expression":"37*12"}'
    flat = {"name": "calculator", "arguments": raw}  # no "function" wrapper
    messages = [*USER, {"role": "assistant", "content": "", "tool_calls": [flat]}]
    text = render(tokenizer, messages, [CALCULATOR_TOOL])
    assert text.endswith(
        '<|im_start|>assistant\n<tool_call>\n{"name": "calculator", "arguments": '
        + raw
        + "}\n</tool_call><|im_end|>\n"
    )


def test_generation_prompt_is_a_token_prefix_of_the_turn(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    messages = [*USER, {"role": "assistant", "content": "", "tool_calls": [call("37 * 12")]}]
    prompt = render(tokenizer, USER, [CALCULATOR_TOOL], add_generation_prompt=True)
    full = render(tokenizer, messages, [CALCULATOR_TOOL])
    assert full.startswith(prompt)
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    full_ids = tokenizer.encode(full, add_special_tokens=False)
    assert full_ids[: len(prompt_ids)] == prompt_ids


def test_special_and_added_tokens(tokenizer: PreTrainedTokenizerBase) -> None:
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token == "<|endoftext|>"
    ids = tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    assert ids == [0, 1, 2]
    assert tokenizer.eos_token_id == 2
    assert tokenizer.pad_token_id == 0
    assert tokenizer.bos_token is None
    assert len(tokenizer) == 512
    special = {t.content for t in tokenizer.added_tokens_decoder.values() if t.special}
    plain = {t.content for t in tokenizer.added_tokens_decoder.values() if not t.special}
    assert special == {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}
    assert plain == {
        "<tool_call>",
        "</tool_call>",
        "<tool_response>",
        "</tool_response>",
        "<tools>",
        "</tools>",
    }
    # Each control string is one token, and tool tags survive skip_special_tokens.
    text = '<|im_start|>assistant\n<tool_call>\n{"a": 1}\n</tool_call><|im_end|>'
    encoded = tokenizer.encode(text, add_special_tokens=False)
    for token in ("<|im_start|>", "<tool_call>", "</tool_call>", "<|im_end|>"):
        assert tokenizer.convert_tokens_to_ids(token) in encoded
    assert tokenizer.decode(encoded) == text
    assert tokenizer.decode(encoded, skip_special_tokens=True) == (
        'assistant\n<tool_call>\n{"a": 1}\n</tool_call>'
    )


def test_digits_are_single_tokens(tokenizer: PreTrainedTokenizerBase) -> None:
    tokens = tokenizer.tokenize("12345 + 678")
    digits = [t for t in tokens if any(c.isdigit() for c in t)]
    assert digits == ["1", "2", "3", "4", "5", "6", "7", "8"]
    assert tokenizer.decode(tokenizer.encode("x = -0.25 * 1000", add_special_tokens=False)) == (
        "x = -0.25 * 1000"
    )


def test_loaded_tokenizer_matches_tokenizer_json(tokenizer: PreTrainedTokenizerBase) -> None:
    """transformers 5 rebuilds a Qwen2Tokenizer from vocab and merges (keyed on model_type):
    its pipeline must be the one the model was trained with, stored in tokenizer.json."""
    raw = Tokenizer.from_file(str(DEMO_MODEL_PATH / "tokenizer.json"))
    messages = [
        *USER,
        {"role": "assistant", "content": "", "tool_calls": [call("(4 + 5) * -3 // 2")]},
        {"role": "tool", "content": "-14"},
        {"role": "assistant", "content": "The answer is -14.\n\nDone!  Thanks, it's 3.5 now."},
    ]
    text = render(tokenizer, messages, [CALCULATOR_TOOL])
    assert tokenizer.encode(text, add_special_tokens=False) == raw.encode(text).ids
    config = json.loads((DEMO_MODEL_PATH / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["tokenizer_class"] == "Qwen2Tokenizer"
