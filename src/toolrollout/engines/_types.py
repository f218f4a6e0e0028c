"""Typed values that cross the engine seam: frozen dataclasses, cheap on the hot path."""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, chain
from typing import Any, Literal, overload

from toolrollout._exceptions import UserError

__all__ = [
    "FinishReason",
    "GenerateRequest",
    "GenerateResult",
    "SamplingParams",
    "StreamChunk",
    "TokenRuns",
    "token_id_array",
]

FinishType = Literal["stop", "length", "abort"]


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Sampling settings, named as SGLang's ``sampling_params`` names them."""

    max_new_tokens: int = 128
    """Upper bound on generated tokens. SGLang defaults to 128 too; always set it."""
    temperature: float = 1.0
    """Below 1e-6 means greedy (SGLang turns it into top_k=1, temperature=1)."""
    top_p: float = 1.0
    top_k: int = -1
    """-1 disables top-k."""
    min_p: float = 0.0
    stop: tuple[str, ...] = ()
    """Stop strings; the matched string ends the output (its tokens stay in ``output_ids``)."""
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None
    """Per-request sampling seed (SGLang's ``sampling_seed``)."""
    n: int = 1
    skip_special_tokens: bool = False
    """Only affects the returned ``text``; ``output_ids`` are never trimmed."""

    def to_sglang(self) -> dict[str, Any]:
        """Return the ``sampling_params`` object of a SGLang ``/generate`` body."""
        body: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "skip_special_tokens": self.skip_special_tokens,
            "no_stop_trim": True,
        }
        body.update(self.stop_settings())
        if self.seed is not None:
            body["sampling_seed"] = self.seed
        if self.n != 1:
            body["n"] = self.n
        return body

    def stop_settings(self) -> dict[str, Any]:
        """The stop settings that are set, named alike by SGLang and vLLM."""
        settings = {
            "stop": list(self.stop),
            "stop_token_ids": list(self.stop_token_ids),
            "ignore_eos": self.ignore_eos,
        }
        return {key: value for key, value in settings.items() if value}


@dataclass(frozen=True, slots=True)
class FinishReason:
    """Why generation ended, mirroring SGLang's ``meta_info.finish_reason``."""

    type: FinishType
    matched: int | str | None = None
    """For ``stop``: the token id (EOS / stop_token_ids) or the stop string matched."""
    length: int | None = None
    """For ``length``: the number of tokens generated."""
    message: str | None = None
    """For ``abort``: the server's explanation, if any."""

    def to_sglang(self) -> dict[str, Any]:
        """Return the JSON object SGLang puts in ``meta_info.finish_reason``."""
        if self.type == "stop":
            return {"type": "stop", "matched": self.matched}
        if self.type == "length":
            return {"type": "length", "length": self.length}
        return {"type": "abort", "message": self.message}


class TokenRuns(Sequence[int]):
    """Token ids kept as the runs they were made of (a prompt, then each span), not joined.

    Joined, a waiting request would hold a second copy of its transcript; as runs it is a
    few pointers. The runs are shared, so they must not change while the request lives. It
    reads and compares like an ``array('i')`` of the same ids.
    """

    __slots__ = ("_ends", "_runs")

    def __init__(self, runs: Iterable[array[int]]) -> None:
        kept = tuple(run for run in runs if len(run))
        for run in kept:
            if not isinstance(run, array) or run.typecode != "i":
                got = type(run).__name__
                raise UserError(f"TokenRuns: every run must be an array('i'), got {got}")
        self._runs = kept
        self._ends = tuple(accumulate(len(run) for run in kept))

    @property
    def runs(self) -> tuple[array[int], ...]:
        return self._runs

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __iter__(self) -> Iterator[int]:
        return chain.from_iterable(self._runs)

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> array[int]: ...

    def __getitem__(self, index: int | slice) -> int | array[int]:
        if isinstance(index, slice):
            return self.joined()[index]
        size = len(self)
        if index < 0:
            index += size
        if not 0 <= index < size:
            raise IndexError("TokenRuns index out of range")
        run = bisect_right(self._ends, index)
        start = self._ends[run - 1] if run else 0
        return self._runs[run][index - start]

    def joined(self) -> array[int]:
        """One new ``array('i')`` of every id (a copy)."""
        out = array("i")
        for run in self._runs:
            out += run
        return out

    def tolist(self) -> list[int]:
        out: list[int] = []
        for run in self._runs:
            out += run.tolist()
        return out

    def tobytes(self) -> bytes:
        return b"".join(run.tobytes() for run in self._runs)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TokenRuns | array):
            if isinstance(other, array) and other.typecode != "i":
                other = array("i", other)
            return len(self) == len(other) and self.tobytes() == other.tobytes()
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable-backed, like array

    def __repr__(self) -> str:
        return f"TokenRuns({self.tolist()!r})"


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    """One token-in generation request.

    ``input_ids`` is kept as an ``array('i')``, or as the :class:`TokenRuns` it was given: with
    thousands of requests waiting, tuples of Python ints would be most of the client's memory.
    Compare it with ``list(request.input_ids)``: it never equals a list or a tuple.
    """

    input_ids: Sequence[int]
    """The prompt ids: an ``array('i')`` or a :class:`TokenRuns` once the request is built."""
    sampling: SamplingParams = field(default_factory=SamplingParams)
    rid: str | None = None
    """Request id, usable with ``abort``. Generated by the engine when omitted."""
    session_id: str | None = None
    """Groups the turns of one trajectory so a multi-server client keeps them on one server."""
    return_logprob: bool = True
    image_data: tuple[Any, ...] | None = None
    """Images in a form SGLang accepts (base64 / data URL / path). Unused by text models."""
    priority: int | None = None
    """SGLang's per-request ``priority`` (None: not sent). Set by the client's scheduling
    policy only for servers that report priority scheduling enabled."""

    def __post_init__(self) -> None:
        if not isinstance(self.input_ids, TokenRuns):
            object.__setattr__(self, "input_ids", token_id_array(self.input_ids))


def token_id_array(ids: Sequence[int]) -> array[int]:
    """``ids`` as an ``array('i')`` (an array is not copied); a non-int or out-of-range id
    raises :class:`UserError` naming ``input_ids``."""
    if isinstance(ids, array) and ids.typecode == "i":
        return ids
    if isinstance(ids, TokenRuns):
        return ids.joined()
    try:
        return array("i", ids)
    except (TypeError, OverflowError) as exc:
        raise UserError(f"GenerateRequest.input_ids: {exc} (token ids are 32-bit ints)") from None


@dataclass(frozen=True, slots=True)
class GenerateResult:
    """The engine's answer to one request (one sample)."""

    rid: str
    output_ids: tuple[int, ...]
    """Generated token ids, including the matched stop / EOS token."""
    output_logprobs: tuple[float, ...] | None
    """One logprob per output id: log_softmax(logits / temperature), before top-k/top-p."""
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    weight_version: str = "default"
    weight_spans: tuple[tuple[int, int, str], ...] = ()
    """``(start, end, version)`` over ``output_ids`` when the server reports which weights
    sampled which tokens (SGLang's ``meta_info.weight_versions``: a request paused in place
    across a weight update has two); empty: every token is ``weight_version``'s."""
    text: str | None = None
    e2e_latency: float | None = None
    server_url: str | None = None
    """Which server answered (multi-server clients)."""


@dataclass(frozen=True, slots=True)
class StreamChunk:
    """One streamed update, normalised to cumulative form whatever the server sends."""

    rid: str
    output_ids: tuple[int, ...]
    """All ids generated so far."""
    output_logprobs: tuple[float, ...] | None
    """All logprobs so far (``None`` when logprobs were not requested)."""
    new_ids: tuple[int, ...]
    """The ids this chunk added."""
    text: str | None
    """The text so far, when the server has a tokenizer."""
    result: GenerateResult | None = None
    """The complete result, on the final chunk only."""

    @property
    def finished(self) -> bool:
        return self.result is not None

    @classmethod
    def final(cls, result: GenerateResult, *, before: int = 0) -> StreamChunk:
        """The last chunk of a stream: everything ``result`` holds (``before``: ids sent in
        earlier chunks)."""
        return cls(
            rid=result.rid,
            output_ids=result.output_ids,
            output_logprobs=result.output_logprobs,
            new_ids=result.output_ids[before:],
            text=result.text,
            result=result,
        )
