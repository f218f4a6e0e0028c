"""SGLang's native ``/generate`` wire format: request normalisation and response shapes.

The parsing mirrors ``GenerateReqInput.normalize_batch_and_arguments`` (``io_struct.py``)
and the output mirrors ``TokenizerManager._handle_batch_output`` /
``_handle_abort_req`` (``tokenizer_manager.py``), including key order and messages, so a
client written against SGLang cannot tell the two servers apart.
"""

from __future__ import annotations

import math
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from toolrollout.engines._types import FinishReason, GenerateRequest, SamplingParams
from toolrollout.engines.embedded import EmbeddedOutput, GenerationOptions, TopLogprobs

__all__ = [
    "BadRequest",
    "MalformedRequest",
    "ParsedGenerate",
    "SubRequest",
    "finish_reason_json",
    "output_json",
    "parse_generate",
]

_DEFAULT_MAX_NEW_TOKENS = 128
"""SGLang's default ``max_new_tokens``."""

_SAMPLING_KEYS = frozenset(
    {
        "max_new_tokens",
        "stop",
        "stop_token_ids",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "n",
        "ignore_eos",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "no_stop_trim",
        "sampling_seed",
        "stream_interval",
    }
)
_UNSUPPORTED_SAMPLING_DEFAULTS: dict[str, Any] = {
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_new_tokens": 0,
    "json_schema": None,
    "regex": None,
    "ebnf": None,
    "structural_tag": None,
    "stop_regex": None,
    "custom_params": None,
    "logit_bias": None,
}
"""SGLang keys the embedded engine accepts only at their no-op value."""


class BadRequest(ValueError):
    """A request SGLang rejects with ``{"error": {"message": ...}}`` (its ValueErrors)."""


class MalformedRequest(ValueError):
    """A body FastAPI itself rejects (bad JSON, wrong types): SGLang's validation shape."""


@dataclass(frozen=True, slots=True)
class SubRequest:
    """One sample to generate: a batch item, or one of the ``n`` samples of an item."""

    request: GenerateRequest
    options: GenerationOptions
    return_text_in_logprobs: bool


@dataclass(frozen=True, slots=True)
class ParsedGenerate:
    subs: list[SubRequest]
    single: bool
    """Answer with one object rather than an array."""
    stream: bool


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _per_item(value: Any, name: str, default: Any, batch: int, n: int) -> list[Any]:
    """SGLang's ``normalize_param``: a scalar applies to all, a list gives one per item."""
    if value is None:
        return [default] * batch
    if not isinstance(value, list):
        return [value] * batch
    if n > 1:
        raise BadRequest(f"Cannot use list {name} with parallel_sample_num > 1")
    if len(value) != batch:
        raise BadRequest(f"The length of {name} should be equal to the batch size.")
    return value


def _prompts(
    body: dict[str, Any], tokenize: Callable[[str], list[int]]
) -> tuple[list[list[int]], bool]:
    text, input_ids = body.get("text"), body.get("input_ids")
    if text is None and input_ids is None and body.get("input_embeds") is None:
        raise BadRequest("Either text, input_ids or input_embeds should be provided.")
    if text is not None:
        if isinstance(text, str):
            return [tokenize(text)], True
        if isinstance(text, list) and all(isinstance(t, str) for t in text):
            return [tokenize(t) for t in text], False
        raise MalformedRequest("text: Input should be a valid string or a list of strings")
    if input_ids is None:
        raise BadRequest("input_embeds is not supported by toolrollout's embedded engine.")
    if not isinstance(input_ids, list):
        raise MalformedRequest("input_ids: Input should be a valid list")
    if len(input_ids) == 0:
        raise BadRequest("input_ids cannot be empty.")
    if all(_is_int(t) for t in input_ids):
        return [list(input_ids)], True
    if all(isinstance(row, list) and all(_is_int(t) for t in row) for row in input_ids):
        return [list(row) for row in input_ids], False
    raise MalformedRequest(
        "input_ids: Input should be a list of integers or a list of lists of integers"
    )


def _rids(rid: Any, batch: int, num: int, single: bool) -> list[str]:
    """SGLang's ``_normalize_rid``: a string rid of a batch gets ``_0``, ``_1``... suffixes."""
    if single:
        if rid is None:
            return [uuid.uuid4().hex]
        if not isinstance(rid, str):
            raise BadRequest("The rid should be a string or a list of strings.")
        return [rid]
    if rid is None:
        return [uuid.uuid4().hex for _ in range(num)]
    if isinstance(rid, str):
        return [f"{rid}_{i}" for i in range(num)]
    if isinstance(rid, list) and all(isinstance(r, str) for r in rid):
        if len(rid) != batch:
            raise BadRequest(
                "The specified rids length mismatch with the batch_size for batch processing."
            )
        return list(rid)
    raise BadRequest("The rid should be a string or a list of strings.")


def _sampling(
    raw: Any, prompt_len: int, context_length: int
) -> tuple[SamplingParams, dict[str, bool]]:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise MalformedRequest("sampling_params: Input should be a valid dictionary")
    _check_sampling_keys(raw)

    def number(key: str, default: float) -> float:
        value = raw.get(key)
        if value is None:
            return default
        if not _is_number(value):
            raise BadRequest(f"sampling_params.{key} must be a number, got {value!r}.")
        return float(value)

    def integer(key: str, default: int | None) -> int | None:
        value = raw.get(key)
        if value is None:
            return default
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not _is_int(value):
            raise BadRequest(f"sampling_params.{key} must be an integer, got {value!r}.")
        return int(value)

    def flag(key: str, default: bool) -> bool:
        value = raw.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise BadRequest(f"sampling_params.{key} must be a boolean, got {value!r}.")
        return value

    stops = _stops(raw.get("stop"))
    stop_ids = raw.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(_is_int(t) for t in stop_ids if t is not None):
        raise BadRequest(
            f"sampling_params.stop_token_ids must be a list of integers, got {stop_ids!r}."
        )
    if "max_new_tokens" in raw and raw["max_new_tokens"] is None:
        max_new = max(context_length - prompt_len, 0)  # SGLang: no limit but the context
    else:
        max_new = integer("max_new_tokens", _DEFAULT_MAX_NEW_TOKENS) or 0
    params = SamplingParams(
        max_new_tokens=max_new,
        temperature=number("temperature", 1.0),
        top_p=number("top_p", 1.0),
        top_k=integer("top_k", -1) or 0,
        min_p=number("min_p", 0.0),
        stop=stops,
        stop_token_ids=tuple(int(t) for t in stop_ids if t is not None),
        ignore_eos=flag("ignore_eos", False),
        seed=integer("sampling_seed", None),
        n=1,
        skip_special_tokens=flag("skip_special_tokens", True),
    )
    extras = {
        "no_stop_trim": flag("no_stop_trim", False),
        "spaces_between_special_tokens": flag("spaces_between_special_tokens", True),
    }
    return params, extras


def _check_sampling_keys(raw: dict[str, Any]) -> None:
    """Refuse unknown keys, and known ones this engine does not implement unless unset."""
    for key, value in raw.items():
        if key in _SAMPLING_KEYS:
            continue
        if key in _UNSUPPORTED_SAMPLING_DEFAULTS:
            if value is not None and value != _UNSUPPORTED_SAMPLING_DEFAULTS[key]:
                raise BadRequest(
                    f"sampling_params.{key}={value!r} is not supported by toolrollout's "
                    "embedded engine."
                )
            continue
        raise BadRequest(f"sampling_params: unexpected keyword argument '{key}'")


def _stops(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return tuple(stop)
    raise BadRequest(f"sampling_params.stop must be a string or a list of strings, got {stop!r}.")


def _parallel_sample_num(sampling: Any) -> int:
    if isinstance(sampling, dict):
        n = sampling.get("n", 1)
    elif isinstance(sampling, list) and sampling and all(isinstance(s, dict) for s in sampling):
        n = sampling[0].get("n", 1)
        if any(s.get("n", 1) != n for s in sampling):
            raise BadRequest(
                "The parallel_sample_num should be the same for all samples in sample params."
            )
    elif sampling is None:
        return 1
    else:
        raise MalformedRequest("sampling_params: Input should be a dictionary or a list")
    n = 1 if n is None else n
    if not _is_int(n) or n < 1:
        raise BadRequest(f"sampling_params.n must be a positive integer, got {n!r}.")
    return int(n)


def _images(image_data: Any, batch: int) -> list[tuple[Any, ...] | None]:
    """Per batch item images, as SGLang's ``_normalize_image_data`` groups them.

    One request: a single item or a list of its images. A batch: one entry per item, each
    a single image, a list of images, or None.
    """
    if image_data is None:
        return [None] * batch
    if batch == 1:
        items = image_data if isinstance(image_data, list) else [image_data]
        flat = [x for item in items for x in (item if isinstance(item, list) else [item])]
        return [tuple(x for x in flat if x is not None) or None]
    if not isinstance(image_data, list) or len(image_data) != batch:
        raise BadRequest("image_data must have one entry per batch item.")
    out: list[tuple[Any, ...] | None] = []
    for entry in image_data:
        group = entry if isinstance(entry, list) else [entry]
        out.append(tuple(x for x in group if x is not None) or None)
    return out


def parse_generate(
    body: Any, *, tokenize: Callable[[str], list[int]], context_length: int
) -> ParsedGenerate:
    """Turn a ``/generate`` JSON body into the samples to run, in response order.

    Batch items keep their order; with ``n > 1`` each item's samples follow each other and
    get fresh uuid rids, as in SGLang's ``_handle_batch_request``.
    """
    if not isinstance(body, dict):
        raise MalformedRequest(
            "Input should be a valid dictionary or object to extract fields from"
        )
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise MalformedRequest("stream: Input should be a valid boolean")
    prompts, single = _prompts(body, tokenize)
    sampling_raw = body.get("sampling_params")
    n = _parallel_sample_num(sampling_raw)
    if n > 1:
        single = False
    batch = len(prompts)
    if isinstance(sampling_raw, list):
        if len(sampling_raw) != batch:
            raise BadRequest("The length of sampling_params should be equal to the batch size.")
        samplings = sampling_raw
    else:
        samplings = [sampling_raw] * batch
    rids = _rids(body.get("rid"), batch, batch * n, single)
    return_logprob = _per_item(body.get("return_logprob"), "return_logprob", False, batch, n)
    start_len = _per_item(body.get("logprob_start_len"), "logprob_start_len", -1, batch, n)
    top_num = _per_item(body.get("top_logprobs_num"), "top_logprobs_num", 0, batch, n)
    text_in_logprobs = bool(body.get("return_text_in_logprobs", False))
    images = _images(body.get("image_data"), batch)
    for name, value in (
        ("input_embeds", body.get("input_embeds")),
        ("lora_path", body.get("lora_path")),
    ):
        if value is not None:
            raise BadRequest(f"{name} is not supported by toolrollout's embedded engine.")
    if body.get("token_ids_logprob"):
        raise BadRequest("token_ids_logprob is not supported by toolrollout's embedded engine.")
    if not single and len(set(rids)) != len(rids):
        duplicates = [r for r, count in Counter(rids).items() if count > 1]
        raise BadRequest(f"Duplicate request IDs detected within the request: {duplicates}")

    subs: list[SubRequest] = []
    for i, prompt in enumerate(prompts):
        params, extras = _sampling(samplings[i], len(prompt), context_length)
        if not isinstance(return_logprob[i], bool):
            raise MalformedRequest("return_logprob: Input should be a valid boolean")
        if not _is_int(start_len[i]) or not _is_int(top_num[i]):
            raise MalformedRequest("logprob_start_len/top_logprobs_num: Input should be an integer")
        options = GenerationOptions(
            no_stop_trim=extras["no_stop_trim"],
            spaces_between_special_tokens=extras["spaces_between_special_tokens"],
            logprob_start_len=int(start_len[i]),
            top_logprobs_num=int(top_num[i]) if return_logprob[i] else 0,
            stream=stream,
        )
        for _ in range(n):
            rid = uuid.uuid4().hex if n > 1 else rids[i]
            request = GenerateRequest(
                input_ids=tuple(prompt),
                sampling=params,
                rid=rid,
                return_logprob=bool(return_logprob[i]),
                image_data=images[i],
            )
            subs.append(SubRequest(request, options, text_in_logprobs))
    return ParsedGenerate(subs=subs, single=single, stream=stream)


# ---------------------------------------------------------------------------- responses
def finish_reason_json(finish: FinishReason | None) -> dict[str, Any] | None:
    """``meta_info.finish_reason`` as SGLang's ``BaseFinishReason.to_json`` writes it."""
    if finish is None:
        return None
    if finish.type == "stop":
        return {"type": "stop", "matched": finish.matched}
    if finish.type == "length":
        return {"type": "length", "length": finish.length}
    return {"type": "abort", "message": finish.message, "status_code": None, "err_type": None}


def _lp(value: float | None) -> float | None:
    # orjson (SGLang's encoder) writes non-finite floats as null.
    return value if value is not None and math.isfinite(value) else None


def _logprob_fields(
    out: EmbeddedOutput, sub: SubRequest, decode: Callable[[int], str]
) -> dict[str, Any]:
    def text(tid: int) -> str | None:
        return decode(tid) if sub.return_text_in_logprobs else None

    def tops(entries: TopLogprobs | None) -> list[list[Any]] | None:
        if entries is None:
            return None
        return [[_lp(v), t, text(t)] for v, t in entries]

    fields: dict[str, Any] = {
        "input_token_logprobs": [
            [_lp(v), t, text(t)]
            for v, t in zip(out.input_logprobs, out.input_token_ids, strict=True)
        ],
        "output_token_logprobs": [
            [_lp(v), t, text(t)] for v, t in zip(out.output_logprobs, out.output_ids, strict=True)
        ],
        "output_token_logprobs_length": len(out.output_ids),
    }
    if sub.options.top_logprobs_num > 0:
        fields["input_top_logprobs"] = [tops(e) for e in out.input_top_logprobs]
        fields["output_top_logprobs"] = [tops(e) for e in out.output_top_logprobs]
    return fields


def output_json(
    out: EmbeddedOutput, sub: SubRequest, decode: Callable[[int], str], *, first_sent: bool
) -> dict[str, Any]:
    """One ``{"text", "output_ids", "meta_info"}`` object, keys in SGLang's order.

    ``first_sent`` marks the first object sent for this request: SGLang stamps
    ``response_sent_to_client_ts`` once per request (the first stream chunk, or the only
    non-streaming answer).
    """
    meta: dict[str, Any]
    if out.aborted_in_waiting_queue:
        # TokenizerManager._handle_abort_req: a request that never reached the scheduler.
        meta = {
            "id": out.rid,
            "finish_reason": {"type": "abort", "message": (out.finish_reason or _ABORT).message},
            "weight_version": out.weight_version,
            "e2e_latency": out.e2e_latency,
            "weight_versions": weight_versions_json(out),
        }
        if sub.request.return_logprob:
            meta.update(_logprob_fields(out, sub, decode))
        meta["completion_tokens"] = out.completion_tokens
    else:
        meta = {
            "id": out.rid,
            "finish_reason": finish_reason_json(out.finish_reason),
            "prompt_tokens": out.prompt_tokens,
            "weight_version": out.weight_version,
            "num_retractions": 0,
        }
        if sub.request.return_logprob:
            meta.update(_logprob_fields(out, sub, decode))
        meta["reasoning_tokens"] = 0
        meta["completion_tokens"] = out.completion_tokens
        meta["cached_tokens"] = out.cached_tokens
        meta["weight_versions"] = weight_versions_json(out)
        if out.finished:
            meta["e2e_latency"] = out.e2e_latency
    if first_sent:
        meta["response_sent_to_client_ts"] = time.time()
    return {"text": out.text, "output_ids": list(out.output_ids), "meta_info": meta}


def weight_versions_json(out: EmbeddedOutput) -> list[dict[str, Any]]:
    """SGLang's ``meta_info.weight_versions`` (``utils/weight_versions.py``): the runs of
    output ids by the weights that sampled them; one empty run of the current version
    when there is no output yet."""
    spans = out.weight_spans or ((0, 0, out.weight_version),)
    return [{"version": v, "start": start, "end": end} for start, end, v in spans]


_ABORT = FinishReason("abort", message="Aborted")
