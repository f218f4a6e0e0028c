"""A ``/generate`` request checked as SGLang checks it (the same exceptions and messages),
and a finished output as the engine seam's result.
"""

from __future__ import annotations

import random
import secrets

from toolrollout._exceptions import EngineRequestRejected, OverlongPromptError, UserError
from toolrollout.engines._types import GenerateRequest, GenerateResult
from toolrollout.engines.embedded._model import ModelMeta
from toolrollout.engines.embedded._output import EmbeddedOutput
from toolrollout.engines.embedded._sampling import (
    GenerationOptions,
    ResolvedSampling,
    resolve_sampling,
)
from toolrollout.engines.embedded._vision import VisionInputs

__all__ = [
    "check_context",
    "check_one_sample",
    "image_refusal",
    "to_result",
    "validated",
]


def check_one_sample(request: GenerateRequest) -> None:
    """The embedded engine makes one sample per request."""
    if request.sampling.n != 1:
        raise UserError(
            f"EmbeddedEngine.generate makes one sample per call (sampling.n must be 1, "
            f"got {request.sampling.n}); send n requests instead"
        )


def validated(
    request: GenerateRequest,
    options: GenerationOptions,
    meta: ModelMeta,
    vision: VisionInputs | None,
) -> tuple[list[int], ResolvedSampling, random.Random | None, int]:
    """The prompt ids, the resolved sampling, the request's random stream (None: greedy)
    and how many trailing tokens to decode when looking for stop strings; raises for an
    invalid request."""
    ids = [int(t) for t in request.input_ids] if vision is None else list(vision.input_ids)
    if not ids:
        raise EngineRequestRejected("input_ids cannot be empty.", status_code=400)
    vocab = meta.vocab_size
    if any(t >= vocab or t < 0 for t in ids):
        raise EngineRequestRejected(
            f"The input_ids {ids} contains values greater than the vocab size ({vocab}).",
            status_code=400,
        )
    check_context(meta.context_length, len(ids), request.sampling.max_new_tokens)
    sampling = resolve_sampling(request.sampling)
    if options.logprob_start_len < -1:
        raise EngineRequestRejected(
            f"logprob_start_len must be -1 or at least 0, got {options.logprob_start_len}.",
            status_code=400,
        )
    if options.top_logprobs_num < 0:
        raise EngineRequestRejected(
            f"top_logprobs_num must be at least 0, got {options.top_logprobs_num}.",
            status_code=400,
        )
    rng: random.Random | None = None
    if not sampling.greedy:
        rng = random.Random(sampling.seed if sampling.seed is not None else secrets.randbits(64))
    stop_tail = 1 + max(
        (len(meta.tokenizer.encode(s, add_special_tokens=False)) for s in sampling.stop),
        default=0,
    )
    return ids, sampling, rng, stop_tail


def check_context(context: int, prompt_tokens: int, max_new_tokens: int) -> None:
    """SGLang's ``_validate_one_request`` length checks, with its messages."""
    if prompt_tokens >= context:
        raise OverlongPromptError(
            f"The input ({prompt_tokens} tokens) is longer than the model's context "
            f"length ({context} tokens).",
            status_code=400,
        )
    if max_new_tokens + prompt_tokens > context:
        raise OverlongPromptError(
            "Requested token count exceeds the model's maximum context length of "
            f"{context} tokens. You requested a total of {max_new_tokens + prompt_tokens} "
            f"tokens: {prompt_tokens} tokens from the input messages and {max_new_tokens} "
            "tokens for the completion. Please reduce the number of tokens in the input "
            "messages or the completion to fit within the limit.",
            status_code=400,
        )


def image_refusal(meta: ModelMeta) -> str:
    """Why ``meta``'s model takes no images here."""
    name = f"{meta.model_path} ({meta.model_type or 'unknown type'})"
    if not meta.has_vision:
        return (
            f"image_data was given but the model {name} has no image understanding; "
            "send text-only requests to this model."
        )
    return (
        f"image_data needs a Qwen2-VL-family model with a Pillow image processor in its "
        f"folder; {name} cannot take images in toolrollout's embedded engine."
    )


def to_result(out: EmbeddedOutput, request: GenerateRequest) -> GenerateResult:
    """A finished output as the seam's :class:`GenerateResult`."""
    assert out.finish_reason is not None  # only finished outputs are results
    return GenerateResult(
        rid=out.rid,
        output_ids=out.output_ids,
        output_logprobs=out.output_logprobs if request.return_logprob else None,
        finish_reason=out.finish_reason,
        prompt_tokens=out.prompt_tokens,
        completion_tokens=out.completion_tokens,
        cached_tokens=out.cached_tokens,
        weight_version=out.weight_version,
        weight_spans=out.weight_spans,
        text=out.text,
        e2e_latency=out.e2e_latency,
    )
