"""Sampling settings resolved the way SGLang resolves them, and the batched sampler.

The rules and messages are SGLang's (``sampling/sampling_params.py``), so that a client sees
identical errors from both engines.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

from toolrollout._exceptions import EngineRequestRejected
from toolrollout.engines._types import SamplingParams

__all__ = [
    "TOP_K_ALL",
    "GenerationOptions",
    "ResolvedSampling",
    "resolve_sampling",
    "sample_next_tokens",
]

_SAMPLING_EPS = 1e-6
TOP_K_ALL = 1 << 30
"""SGLang's stand-in for "top-k disabled"."""


@dataclass(frozen=True, slots=True)
class GenerationOptions:
    """Per-request knobs of SGLang's ``/generate`` that the engine contract does not carry."""

    no_stop_trim: bool = True
    """Keep the matched stop string / stop token in ``text`` (``output_ids`` always keep it)."""
    spaces_between_special_tokens: bool = True
    """Accepted for SGLang compatibility; fast tokenizers ignore it."""
    logprob_start_len: int = -1
    """First prompt position whose logprob is returned; -1 returns no prompt logprobs."""
    top_logprobs_num: int = 0
    """Number of most likely tokens reported per position."""
    stream: bool = False
    """Deliver a cumulative snapshot after every decode step, not only the final result."""


@dataclass(frozen=True, slots=True)
class ResolvedSampling:
    """Sampling values after SGLang's normalisation; what the scheduler works with."""

    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    stop: tuple[str, ...]
    stop_token_ids: frozenset[int]
    ignore_eos: bool
    seed: int | None
    skip_special_tokens: bool

    @property
    def greedy(self) -> bool:
        """Greedy rows take the arg-max and need no random generator."""
        return self.top_k == 1


def _reject(message: str) -> EngineRequestRejected:
    return EngineRequestRejected(message, status_code=400)


def resolve_sampling(params: SamplingParams) -> ResolvedSampling:
    """Normalise and validate ``params`` exactly as SGLang's ``SamplingParams`` does.

    Raises :class:`EngineRequestRejected` with SGLang's own message for invalid values.
    """
    temperature = float(params.temperature)
    top_k = int(params.top_k)
    if 0 <= temperature < _SAMPLING_EPS:
        temperature = 1.0
        top_k = 1
    if top_k == -1:
        top_k = TOP_K_ALL
    top_p = float(params.top_p)
    min_p = float(params.min_p)

    # The checks and messages of SGLang's SamplingParams.verify, in its order.
    if not math.isfinite(temperature) or temperature < 0.0:
        raise _reject(f"temperature must be a non-negative finite number, got {temperature}.")
    if not 0.0 < top_p <= 1.0:
        raise _reject(f"top_p must be in (0, 1], got {top_p}.")
    if not 0.0 <= min_p <= 1.0:
        raise _reject(f"min_p must be in [0, 1], got {min_p}.")
    if top_k < 1 or top_k == -1:
        raise _reject(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
    if params.max_new_tokens < 0:
        raise _reject(f"max_new_tokens must be at least 0, got {params.max_new_tokens}.")
    return ResolvedSampling(
        max_new_tokens=int(params.max_new_tokens),
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        stop=tuple(s for s in params.stop if s),
        stop_token_ids=frozenset(int(t) for t in params.stop_token_ids),
        ignore_eos=bool(params.ignore_eos),
        seed=params.seed,
        skip_special_tokens=bool(params.skip_special_tokens),
    )


def sample_next_tokens(
    logits: torch.Tensor,
    rows: list[ResolvedSampling],
    rngs: list[random.Random | None],
) -> tuple[list[int], torch.Tensor]:
    """Pick one token per row and return the ids with the rows' log-probabilities.

    The logprobs are SGLang's: ``log_softmax(logits / temperature)`` before filtering; the
    filters follow SGLang's torch sampler. Each row draws from its own generator, so a
    seeded request is reproducible whatever else is in the batch.
    """
    logits = logits.float()
    device = logits.device
    vocab = logits.shape[-1]
    temperatures = torch.tensor([r.temperature for r in rows], dtype=logits.dtype, device=device)
    logprobs = torch.log_softmax(logits / temperatures[:, None], dim=-1)
    chosen = logits.argmax(dim=-1).tolist()

    sampled = [i for i, r in enumerate(rows) if not r.greedy]
    if sampled:
        probs = logprobs[sampled].exp()
        probs_sort, probs_idx = probs.sort(dim=-1, descending=True)
        cumulative = probs_sort.cumsum(dim=-1)
        top_k = torch.tensor([min(rows[i].top_k, vocab) for i in sampled], device=device)
        top_p = torch.tensor([rows[i].top_p for i in sampled], device=device)
        min_p = torch.tensor([rows[i].min_p for i in sampled], device=device)
        ranks = torch.arange(vocab, device=device)[None, :]
        probs_sort = probs_sort.masked_fill(ranks >= top_k[:, None], 0.0)
        probs_sort = probs_sort.masked_fill((cumulative - probs_sort) > top_p[:, None], 0.0)
        threshold = probs_sort[:, :1] * min_p[:, None]
        probs_sort = probs_sort.masked_fill(probs_sort < threshold, 0.0)
        cdf = probs_sort.cumsum(dim=-1)
        draws = [(rngs[i] or random).random() for i in sampled]
        uniform = torch.tensor(draws, dtype=cdf.dtype, device=device)
        target = (uniform * cdf[:, -1])[:, None]
        pick = torch.searchsorted(cdf, target, right=True).clamp_(max=vocab - 1)
        tokens = probs_idx.gather(1, pick)[:, 0].tolist()
        for row, token in zip(sampled, tokens, strict=True):
            chosen[row] = int(token)
    return [int(t) for t in chosen], logprobs
