"""Calling a tokenizer for exact ids and text, the fast way when that gives the same answer.

A transformers fast tokenizer in its default state is called through its Rust backend
directly, at two thirds of ``tokenizer.encode``'s CPU and half of ``tokenizer.decode``'s
(docs/benchmarks.md); anything else goes through the tokenizer's own methods.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

__all__ = ["decode", "encode_many", "encodes_plainly", "plain_backend", "rust_backend"]


def encode_many(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """The ids of each rendered text, no BOS/EOS added (the template writes them)."""
    backend = plain_backend(tokenizer)
    if backend is None:
        encode = tokenizer.encode
        return [[int(i) for i in encode(text, add_special_tokens=False)] for text in texts]
    encodings = backend.encode_batch_fast(list(texts), add_special_tokens=False)
    return [encoding.ids for encoding in encodings]


def decode(tokenizer: Any, ids: Sequence[int]) -> str:
    """``ids`` decoded exactly, special tokens kept."""
    backend = rust_backend(tokenizer)
    if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return cast(str, backend.decode(list(ids), skip_special_tokens=False))
    text = tokenizer.decode(list(ids), skip_special_tokens=False)
    return cast(str, text)


def rust_backend(tokenizer: Any) -> Any:
    """The Rust tokenizer behind a transformers fast tokenizer whose class does not
    override how it encodes or decodes, else ``None``."""
    backend = getattr(tokenizer, "_tokenizer", None)
    return backend if backend is not None and encodes_plainly(type(tokenizer)) else None


def plain_backend(tokenizer: Any) -> Any:
    """The Rust tokenizer behind ``tokenizer`` when calling it directly gives the ids that
    ``tokenizer.encode(text, add_special_tokens=False)`` gives, else ``None``.

    That holds for transformers' fast tokenizer class and its subclasses that leave
    encoding alone, while the backend carries no truncation or padding and splits special
    tokens as the tokenizer says. transformers sets these on the shared backend at each
    call and leaves them set, so a trainer's ``tokenizer(..., truncation=True)`` on the
    same object would otherwise cut a prompt here: they are checked on every call.
    """
    backend = rust_backend(tokenizer)
    if backend is None or backend.truncation is not None or backend.padding is not None:
        return None
    split = bool(getattr(tokenizer, "split_special_tokens", False))
    if bool(backend.encode_special_tokens) != split:
        return None
    return backend


_ENCODING_METHODS = (
    "__call__",
    "_batch_encode_plus",
    "_decode",
    "_encode_plus",
    "decode",
    "encode",
    "encode_plus",
)
_PLAIN: dict[type, bool] = {}


def encodes_plainly(cls: type) -> bool:
    """Whether ``cls`` is a transformers fast tokenizer that does not override how text is
    encoded or decoded (one answer per class, cached)."""
    plain = _PLAIN.get(cls)
    if plain is None:
        from tokenizers import Tokenizer
        from transformers import PreTrainedTokenizerFast

        plain = (
            issubclass(cls, PreTrainedTokenizerFast)
            and hasattr(Tokenizer, "encode_batch_fast")
            and all(
                getattr(cls, name, None) is getattr(PreTrainedTokenizerFast, name, None)
                for name in _ENCODING_METHODS
            )
        )
        _PLAIN[cls] = plain
    return plain
