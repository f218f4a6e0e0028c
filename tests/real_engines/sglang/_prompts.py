"""Prompts of the demo model (its own chat template), as the rollout loop renders them."""

from __future__ import annotations

from functools import cache
from typing import Any

from tests.real_engines.sglang._launch import DEMO_MODEL


@cache
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(DEMO_MODEL)


def chat_ids(question: str) -> list[int]:
    """``question`` as a user turn with the generation prompt, as token ids."""
    text = tokenizer().apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )
    return list(tokenizer().encode(text, add_special_tokens=False))
