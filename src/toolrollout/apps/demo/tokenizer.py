"""The demo model's tokenizer, its chat template and the loss mask of a rendered dialog.

:func:`build_tokenizer` trains a byte-level BPE tokenizer on rendered dialogs with Qwen2's
pre-tokenizer (which splits digits one per token, so the model can copy numbers) and wraps
it as a fast tokenizer; dialogs are rendered with the shipped template
(``demo/chat_template.jinja``), each family's with its tools (:func:`render_dialogs`), and
:func:`encode_dialog` marks what the assistant generates.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
)
from tokenizers.trainers import BpeTrainer
from transformers import PreTrainedTokenizerFast
from transformers.utils.chat_template_utils import render_jinja_template

from toolrollout.apps.demo import DEMO_CHAT_TEMPLATE_PATH
from toolrollout.apps.demo.dialogs import FAMILIES, Dialog, family_tools

__all__ = [
    "IM_END",
    "IM_START",
    "PAD_TOKEN",
    "SPECIAL_TOKENS",
    "TOOL_TOKENS",
    "VOCAB_SIZE",
    "assistant_header",
    "build_tokenizer",
    "chat_template",
    "check_prefix_consistency",
    "encode_dialog",
    "load_tokenizer",
    "render_dialogs",
    "render_plain",
    "token_id",
]

PAD_TOKEN: Final = "<|endoftext|>"
IM_START: Final = "<|im_start|>"
IM_END: Final = "<|im_end|>"
SPECIAL_TOKENS: Final = (PAD_TOKEN, IM_START, IM_END)
"""Control tokens; ids 0, 1, 2 in this order."""
TOOL_TOKENS: Final = (
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<tools>",
    "</tools>",
)
"""Added but not special (as in Qwen2.5): they survive ``skip_special_tokens=True``."""
VOCAB_SIZE: Final = 512
"""Total vocabulary, added tool tokens included."""


def chat_template() -> str:
    """The template text shipped with the model (source: ``demo/chat_template.jinja``)."""
    return DEMO_CHAT_TEMPLATE_PATH.read_text(encoding="utf-8")


QWEN2_PRETOKENIZE_REGEX: Final = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
r"""Qwen2's pre-tokenizer split; ``\p{N}`` on its own isolates every digit (one per token)."""


def token_id(tokenizer: PreTrainedTokenizerFast, token: str) -> int:
    token_id = tokenizer.convert_tokens_to_ids(token)
    assert isinstance(token_id, int)
    return token_id


def build_tokenizer(texts: Sequence[str]) -> PreTrainedTokenizerFast:
    """Train the byte-level BPE tokenizer on rendered dialogs and wrap it for transformers.

    The pipeline (NFC, Qwen2's split regex, byte-level, BPE) is exactly the one that
    transformers' ``Qwen2Tokenizer`` rebuilds from ``vocab``/``merges``: transformers 5 loads
    this folder as a ``Qwen2Tokenizer`` (from ``model_type``), transformers 4 as its fast
    variant from ``tokenizer.json``, and both must tokenize alike.
    """
    core = Tokenizer(
        models.BPE(
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    core.normalizer = normalizers.NFC()
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    core.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(
        vocab_size=VOCAB_SIZE - len(TOOL_TOKENS),
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Learn merges on the plain text between control tokens only.
    control = re.compile("|".join(re.escape(t) for t in (*SPECIAL_TOKENS, *TOOL_TOKENS)))
    segments = [seg for text in texts for seg in control.split(text) if seg]
    core.train_from_iterator(segments, trainer=trainer)
    core.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    if core.get_vocab_size() != VOCAB_SIZE:
        raise RuntimeError(f"tokenizer has {core.get_vocab_size()} tokens, expected {VOCAB_SIZE}")
    return _wrapped(tokenizer_object=core)


def _wrapped(**source: Any) -> PreTrainedTokenizerFast:
    """The fast tokenizer of ``tokenizer_object`` or ``tokenizer_file``, with the demo's
    control tokens and chat template (every stage writes the same tokenizer files)."""
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        **source,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        model_max_length=1024,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = chat_template()
    return tokenizer


def load_tokenizer(folder: Path) -> PreTrainedTokenizerFast:
    """A previous stage's tokenizer, wrapped exactly as :func:`build_tokenizer` wraps a new one."""
    return _wrapped(tokenizer_file=str(folder / "tokenizer.json"))


def render(
    tokenizer: PreTrainedTokenizerFast,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    **kw: Any,
) -> str:
    """Render ``messages`` with ``tools``, as text."""
    schemas: list[Any] = list(tools)
    text = tokenizer.apply_chat_template(messages, tools=schemas, tokenize=False, **kw)
    assert isinstance(text, str)
    return text


def assistant_header(tokenizer: PreTrainedTokenizerFast) -> list[int]:
    ids: list[int] = tokenizer.encode(f"{IM_START}assistant\n", add_special_tokens=False)
    return ids


def encode_dialog(
    tokenizer: PreTrainedTokenizerFast, ids: list[int], header: list[int]
) -> list[bool]:
    """Loss mask for a tokenized dialog: True on assistant-generated tokens.

    That is every token after each ``<|im_start|>assistant\\n`` header up to and including
    the ``<|im_end|>`` that closes the turn (the ``\\n`` after it is template glue).
    """
    im_end = token_id(tokenizer, IM_END)
    mask = [False] * len(ids)
    i, k = 0, len(header)
    while i < len(ids):
        if ids[i : i + k] == header:
            j = i + k
            while j < len(ids) and ids[j] != im_end:
                mask[j] = True
                j += 1
            if j == len(ids):
                raise ValueError("unterminated assistant turn")
            mask[j] = True
            i = j + 1
        else:
            i += 1
    return mask


def check_prefix_consistency(tokenizer: PreTrainedTokenizerFast, dialogs: Sequence[Dialog]) -> None:
    """The prompt the engine sees must tokenize to a prefix of the training sequence."""
    for dialog in dialogs:
        messages, tools = dialog.messages, family_tools(dialog.family)
        full = tokenizer.encode(render(tokenizer, messages, tools), add_special_tokens=False)
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            prompt = render(tokenizer, messages[:i], tools, add_generation_prompt=True)
            ids = tokenizer.encode(prompt, add_special_tokens=False)
            if full[: len(ids)] != ids:
                raise RuntimeError(f"prompt tokens are not a prefix of the dialog: {prompt!r}")


def render_dialogs(dialogs: Sequence[Dialog]) -> list[str]:
    """Render each dialog with its family's tools, as text, in the order given."""
    texts: list[str] = [""] * len(dialogs)
    for family in FAMILIES:
        index = [i for i, d in enumerate(dialogs) if d.family == family]
        rendered = render_plain([dialogs[i].messages for i in index], family_tools(family))
        for i, text in zip(index, rendered, strict=True):
            texts[i] = text
    return texts


def render_plain(dialogs: Sequence[list[dict[str, Any]]], tools: list[dict[str, Any]]) -> list[str]:
    """Render dialogs with the shipped template and ``tools`` (none: no tool section)."""
    schemas: list[Any] | None = list(tools) or None
    # Annotated as returning str, it returns (rendered texts, generation indices).
    result: Any = render_jinja_template(
        conversations=list(dialogs), tools=schemas, chat_template=chat_template()
    )
    return list(result[0])
