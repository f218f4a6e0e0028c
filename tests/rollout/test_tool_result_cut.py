"""Tool results are cut to ``max_tool_response_tokens``; short ones skip the tokenizer.

``_cut_text`` returns an ASCII text of at most ``(limit - 2) / 2`` characters without
tokenizing it (no tokenizer makes more than a token a character plus a prefix of ASCII).
These tests hold it to what tokenizing says: a text is kept whole exactly when its tokens
fit, and a cut text fits.
"""

from __future__ import annotations

import random
import string
from types import SimpleNamespace
from typing import Any

import pytest

from toolrollout.chat import ChatFormat
from toolrollout.rollout import RolloutConfig
from toolrollout.rollout._turns import _cut_text

LIMIT = 64


def _shared(tokenizer: Any, side: str = "middle") -> Any:
    config = RolloutConfig(max_tool_response_tokens=LIMIT, tool_response_truncate_side=side)  # type: ignore[arg-type]
    return SimpleNamespace(config=config, chat=ChatFormat(tokenizer))


def _texts() -> list[str]:
    """ASCII texts around the limit: words, digits, punctuation runs, whitespace runs."""
    rng = random.Random(0)
    alphabets = [
        string.ascii_letters + " ",
        string.digits,
        string.punctuation,
        " \n\t",
        string.printable,
    ]
    lengths = (1, 2, LIMIT // 4, LIMIT // 2 - 1, LIMIT // 2, LIMIT, 2 * LIMIT, 6 * LIMIT)
    return [
        "".join(rng.choice(alphabet) for _ in range(length))
        for alphabet in alphabets
        for length in lengths
    ]


@pytest.mark.parametrize("side", ["left", "right", "middle"])
def test_a_text_is_kept_whole_exactly_when_its_tokens_fit(demo_tokenizer: Any, side: str) -> None:
    shared = _shared(demo_tokenizer, side)
    encode = shared.chat.encode
    for text in _texts():
        cut = _cut_text(shared, text)
        fits = len(encode(text)) <= LIMIT
        assert (cut == text) == fits, (len(text), len(encode(text)))
        if not fits:
            assert "...(truncated)" in cut
            assert len(encode(cut.replace("...(truncated)", ""))) <= LIMIT + 2


def test_a_short_ascii_result_is_not_tokenized(demo_tokenizer: Any) -> None:
    shared = _shared(demo_tokenizer)
    calls: list[str] = []

    class Counting(ChatFormat):
        __slots__ = ()

        def encode(self, text: str) -> list[int]:
            calls.append(text)
            return super().encode(text)

    shared.chat = Counting(demo_tokenizer)
    calls.clear()
    assert _cut_text(shared, "record p1s2.0: value 4711") == "record p1s2.0: value 4711"
    assert calls == []
    long = "value " * LIMIT
    assert _cut_text(shared, long) != long
    assert calls == [long]
    calls.clear()
    _cut_text(shared, "é" * 3)  # not ASCII: tokenized, whatever its length
    assert calls == ["é" * 3]
