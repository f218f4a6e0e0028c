"""Fixtures for tests/chat: small byte-level BPE tokenizers with our own chat templates.

No model hub is reachable, so each family gets a tokenizer trained here in well under a
second on a tiny corpus, with the family's control tokens added the way the real
tokenizers have them (special tokens split the text; ``<tool_call>`` & co. are added,
non-special tokens as in Qwen). Byte-level BPE keeps every string encodable.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

TEMPLATES = Path(__file__).parent / "templates"

# The pre-tokenizer split used by Qwen2 and Llama 3 style byte-level BPE tokenizers.
_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

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
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
]

_CORPUS = [
    "What is 2 + 3? Also, what is the weather in Paris today?",
    "Let me compute that. The answer is 5, and it is sunny in Paris.",
    "You are a careful assistant. Functions you may call are listed below.",
    '{"name": "add", "arguments": {"a": 2, "b": 3}}',
    '{"name": "get_weather", "parameters": {"city": "Paris"}}',
    "<tool_call>\n{}\n</tool_call>\n<tool_response>\n5\n</tool_response>",
    "I should use the calculator first, then report the result.",
    "Sunny, 21 C. Cloudy, 12 C. Rain in London, 9 C.",
    "system user assistant ipython Environment Knowledge cutoff tools",
    json.dumps(TOOLS),
    json.dumps(TOOLS, indent=4),
]

QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN_ADDED = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
QWEN3_ADDED = [*QWEN_ADDED, "<think>", "</think>"]
LLAMA_SPECIAL = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
]


def build_tokenizer(
    *,
    special: Sequence[str],
    added: Sequence[str],
    template: str,
    eos: str,
    bos: str | None = None,
    vocab_size: int = 900,
) -> PreTrainedTokenizerBase:
    """Train a byte-level BPE tokenizer and wrap it as a Hugging Face fast tokenizer."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_CORPUS * 8, trainer)
    backend.add_tokens([AddedToken(token, special=False, normalized=False) for token in added])
    tokenizer: PreTrainedTokenizerBase = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend, eos_token=eos, bos_token=bos, chat_template=template
    )
    return tokenizer


@pytest.fixture(scope="session")
def qwen25_tokenizer() -> PreTrainedTokenizerBase:
    return build_tokenizer(
        special=QWEN_SPECIAL,
        added=QWEN_ADDED,
        template=(TEMPLATES / "qwen25.jinja").read_text(),
        eos="<|im_end|>",
    )


@pytest.fixture(scope="session")
def qwen3_tokenizer() -> PreTrainedTokenizerBase:
    return build_tokenizer(
        special=QWEN_SPECIAL,
        added=QWEN3_ADDED,
        template=(TEMPLATES / "qwen3.jinja").read_text(),
        eos="<|im_end|>",
    )


@pytest.fixture(scope="session")
def llama3_tokenizer() -> PreTrainedTokenizerBase:
    return build_tokenizer(
        special=LLAMA_SPECIAL,
        added=[],
        template=(TEMPLATES / "llama3.jinja").read_text(),
        eos="<|eot_id|>",
        bos="<|begin_of_text|>",
    )


@pytest.fixture
def tools() -> list[dict[str, Any]]:
    return [json.loads(json.dumps(tool)) for tool in TOOLS]
