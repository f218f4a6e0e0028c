"""The embedded engine's full answer: everything SGLang's ``/generate`` can report."""

from __future__ import annotations

from dataclasses import dataclass

from toolrollout.engines._types import FinishReason

__all__ = ["EmbeddedOutput", "TopLogprobs"]

TopLogprobs = tuple[tuple[float, int], ...]
"""The most likely tokens at one position as ``(logprob, token_id)``, best first."""


@dataclass(frozen=True, slots=True)
class EmbeddedOutput:
    """One request's state: a cumulative snapshot while streaming, complete once finished.

    Richer than :class:`~toolrollout.engines.GenerateResult` because the HTTP server needs
    prompt logprobs, top logprobs and SGLang's abort variants.
    """

    rid: str
    output_ids: tuple[int, ...]
    """Generated ids, including the matched EOS / stop token."""
    text: str
    output_logprobs: tuple[float, ...]
    """``log_softmax(logits / temperature)`` of each output id, before top-k/top-p/min-p."""
    output_top_logprobs: tuple[TopLogprobs, ...]
    """Per output position when ``top_logprobs_num > 0``, else empty."""
    input_token_ids: tuple[int, ...]
    """The prompt ids from ``logprob_start_len`` on (empty when it is -1)."""
    input_logprobs: tuple[float | None, ...]
    """Logprob of each of ``input_token_ids`` given the tokens before it; None at position 0."""
    input_top_logprobs: tuple[TopLogprobs | None, ...]
    finish_reason: FinishReason | None
    """None while the request is still running (intermediate stream snapshots)."""
    prompt_tokens: int
    weight_version: str
    e2e_latency: float | None
    """Seconds from submission to the end; None on intermediate snapshots."""
    cached_tokens: int = 0
    """Prefix-cache hits. The embedded engine has no prefix cache, so this is always 0."""
    aborted_in_waiting_queue: bool = False
    """Aborted before prefill; SGLang reports such requests with a shorter ``meta_info``."""
    weight_spans: tuple[tuple[int, int, str], ...] = ()
    """``(start, end, version)`` runs of ``output_ids`` by the weights that produced them."""

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def completion_tokens(self) -> int:
        return len(self.output_ids)
