"""``ChatFormat.encode`` calls the Rust backend directly only where that gives the ids
``tokenizer.encode`` gives: the shipped demo tokenizer (transformers' own Qwen2 class) and
the test families' fast tokenizers, with special tokens, byte-level text and long inputs;
and never while a trainer's call has left truncation or padding set on the shared backend.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

import toolrollout.apps.demo
from toolrollout.chat import ChatFormat
from toolrollout.chat._tokenize import plain_backend as _plain_backend

TEXTS = [
    "",
    "plain words, and numbers 12345 6789",
    "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n",
    '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>',
    "bytes: é ü ß 日本語 🙂 \t tabs\n\nnewlines  double  spaces ",
    "long " * 2000,
]


def _demo_tokenizer() -> PreTrainedTokenizerBase:
    tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(
        str(Path(toolrollout.apps.demo.__file__).parent / "model")
    )
    return tokenizer


@pytest.mark.parametrize("name", ["demo", "qwen25", "qwen3", "llama3"])
def test_the_direct_backend_call_gives_the_tokenizers_ids(
    name: str, request: pytest.FixtureRequest
) -> None:
    tokenizer = (
        _demo_tokenizer() if name == "demo" else request.getfixturevalue(f"{name}_tokenizer")
    )
    assert _plain_backend(tokenizer) is not None  # the fast path is the one under test
    chat = ChatFormat(tokenizer)
    expected = [list(tokenizer.encode(text, add_special_tokens=False)) for text in TEXTS]
    assert [chat.encode(text) for text in TEXTS] == expected
    assert chat.encode_many(TEXTS) == expected
    assert all(type(i) is int for ids in expected for i in chat.encode(TEXTS[3]))
    for ids in expected:  # decoding, which goes to the backend the same way
        assert chat.decode(ids) == tokenizer.decode(ids, skip_special_tokens=False)


def test_truncation_left_on_the_shared_backend_is_not_applied() -> None:
    """transformers keeps the last call's truncation on the backend: a trainer tokenizing
    with ``truncation=True`` must not cut the prompts toolrollout renders afterwards."""
    tokenizer = _demo_tokenizer()
    chat = ChatFormat(tokenizer)
    full = chat.encode(TEXTS[-1])
    tokenizer("a b c d e f g h", truncation=True, max_length=4)
    assert tokenizer.backend_tokenizer.truncation is not None  # left set, as described
    assert _plain_backend(tokenizer) is None
    assert chat.encode(TEXTS[-1]) == full
    assert chat.encode_many([TEXTS[-1]]) == [full]


def test_split_special_tokens_goes_through_the_tokenizer() -> None:
    tokenizer = _demo_tokenizer()
    chat = ChatFormat(tokenizer)  # it checks the stop token is one special token: before
    tokenizer.split_special_tokens = True
    text = TEXTS[2]
    assert _plain_backend(tokenizer) is None
    split = chat.encode(text)
    assert split == list(tokenizer.encode(text, add_special_tokens=False))
    tokenizer.split_special_tokens = False
    assert len(chat.encode(text)) < len(split)  # the special tokens are whole again
