"""vLLM's token-in/token-out wire format (``POST /inference/v1/generate``).

Pure functions, no I/O, as read in vLLM 0.32's source
(``vllm/entrypoints/scale_out/token_in_token_out/``). SGLang's sampling names would be
silently ignored by vLLM, so nothing here shares :meth:`SamplingParams.to_sglang`. The
server runs a request as ``generate-tokens-<request_id>``, the id an abort must name.
"""

from __future__ import annotations

from typing import Any

from ..._exceptions import EngineError
from .._types import FinishReason, GenerateRequest, GenerateResult, SamplingParams
from .._wire import _finite_sampling, _id_list

__all__ = [
    "ABORT_PATH",
    "GENERATE_PATH",
    "generate_body",
    "parse_result",
    "sampling_params",
    "server_request_id",
]

GENERATE_PATH = "/inference/v1/generate"
"""Registered by ``--enable-scale-out`` (or ``--tokens-only``)."""

ABORT_PATH = "/inference/v1/abort_requests"
"""Aborts the ids it is given, and only those (never the dev-mode ``/abort_requests``)."""

_SERVER_PREFIX = "generate-tokens-"


def server_request_id(wire_rid: str) -> str:
    """The id vLLM runs a request sent as ``wire_rid`` under (``serving.py``'s prefix)."""
    return _SERVER_PREFIX + wire_rid


def sampling_params(sampling: SamplingParams, *, logprobs: bool) -> dict[str, Any]:
    """``sampling`` in vLLM's names; ``logprobs: 0`` asks for the sampled token's only."""
    body: dict[str, Any] = {
        "max_tokens": sampling.max_new_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        # vLLM's "no top-k" is 0 or -1; the seam's is -1.
        "top_k": sampling.top_k,
        "min_p": sampling.min_p,
        "skip_special_tokens": sampling.skip_special_tokens,
        # SGLang's no_stop_trim: the matched stop string stays in the text (the ids
        # always keep every generated token).
        "include_stop_str_in_output": True,
        "n": sampling.n,
    }
    if logprobs:
        body["logprobs"] = 0
    body.update(sampling.stop_settings())
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    return _finite_sampling(body)


def generate_body(request: GenerateRequest, wire_rid: str) -> dict[str, Any]:
    """The JSON body of one ``POST /inference/v1/generate``."""
    if request.image_data:
        raise EngineError(
            "VLLMClient sends token ids only: images need vLLM's render step, which "
            "toolrollout does not drive; use an SGLang server for vision models"
        )
    body: dict[str, Any] = {
        "request_id": wire_rid,
        "token_ids": _id_list(request.input_ids),
        "sampling_params": sampling_params(request.sampling, logprobs=request.return_logprob),
    }
    if request.priority is not None:
        body["priority"] = request.priority
    return body


def _malformed(detail: str) -> EngineError:
    return EngineError(f"malformed vLLM response (/inference/v1/generate): {detail}")


def _int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _malformed(f"{what}: expected an integer, got {value!r}")
    return value


def _finish(choice: dict[str, Any], ids: list[int]) -> FinishReason:
    kind = choice.get("finish_reason")
    matched = choice.get("stop_reason")
    if isinstance(matched, bool) or not isinstance(matched, int | str | None):
        raise _malformed(f"choices[0].stop_reason: unexpected {matched!r}")
    if kind in ("stop", "repetition"):
        # stop_reason is null when EOS ended the output: the EOS id is the last one.
        if matched is None and ids:
            matched = ids[-1]
        return FinishReason(type="stop", matched=matched)
    if kind == "length":
        return FinishReason(type="length", length=len(ids))
    if kind == "abort":
        return FinishReason(type="abort", message="aborted by vLLM")
    raise _malformed(f"choices[0].finish_reason: unknown {kind!r}")


def _logprobs(choice: dict[str, Any], ids: list[int]) -> list[float] | None:
    raw = choice.get("logprobs")
    if raw is None:
        return None
    content = raw.get("content") if isinstance(raw, dict) else None
    if not isinstance(content, list):
        raise _malformed(f"choices[0].logprobs: expected {{'content': [...]}}, got {raw!r}")
    if len(content) != len(ids):
        raise _malformed(f"{len(content)} logprobs for {len(ids)} token_ids")
    logprobs: list[float] = []
    for i, (entry, token) in enumerate(zip(content, ids, strict=True)):
        value = entry.get("logprob") if isinstance(entry, dict) else None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _malformed(f"choices[0].logprobs.content[{i}].logprob: got {value!r}")
        if entry.get("token_id") != token:
            raise _malformed(
                f"choices[0].logprobs.content[{i}] is for token {entry.get('token_id')!r}, "
                f"token_ids[{i}] is {token}"
            )
        logprobs.append(float(value))
    return logprobs


def _weight_version(choice: dict[str, Any]) -> str:
    """The label of the weights that sampled the last token, as SGLang labels it."""
    spans = choice.get("weight_versions")
    if not spans:
        return "default"
    last = spans[-1]
    version = last.get("version") if isinstance(last, dict) else None
    return "default" if version is None else str(version)


def parse_result(
    data: object, *, rid: str, request: GenerateRequest, server_url: str | None
) -> GenerateResult:
    """One non-streaming answer as the seam's :class:`GenerateResult`."""
    if not isinstance(data, dict):
        raise _malformed(f"expected a JSON object, got {type(data).__name__}")
    choices = data.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        raise _malformed(f"expected one choice, got {choices!r}"[:300])
    choice = choices[0]
    raw_ids = choice.get("token_ids")
    if not isinstance(raw_ids, list):
        raise _malformed(f"choices[0].token_ids: expected a list, got {raw_ids!r}")
    ids = [_int(token, f"choices[0].token_ids[{i}]") for i, token in enumerate(raw_ids)]
    logprobs = _logprobs(choice, ids)
    if request.return_logprob and logprobs is None:
        raise _malformed("logprobs were asked for (sampling_params.logprobs=0) but are null")
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    assert isinstance(usage, dict)
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    prompt_tokens = usage.get("prompt_tokens")
    return GenerateResult(
        rid=rid,
        output_ids=tuple(ids),
        output_logprobs=None if logprobs is None else tuple(logprobs),
        finish_reason=_finish(choice, ids),
        prompt_tokens=len(request.input_ids)
        if prompt_tokens is None
        else _int(prompt_tokens, "usage.prompt_tokens"),
        completion_tokens=len(ids),
        cached_tokens=0 if cached is None else _int(cached, "cached_tokens"),
        weight_version=_weight_version(choice),
        server_url=server_url,
    )
