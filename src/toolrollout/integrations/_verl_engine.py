"""verl's server manager behind toolrollout's :class:`Engine` seam.

A verl agent loop is handed the trainer's server manager (``LLMServerClient`` in verl 0.9,
``AsyncLLMServerManager`` before); this adapts its ``generate``, so toolrollout's loop runs
on verl's replicas with verl's load balancing, sticky sessions and weight syncs.

Duck-typed on purpose: no verl import here, so it is usable (and testable) without verl.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from toolrollout._exceptions import EngineError
from toolrollout.engines._base import Engine
from toolrollout.engines._control import EngineInfo, ServerInfo
from toolrollout.engines._types import FinishReason, GenerateRequest, GenerateResult

__all__ = ["VerlServerEngine"]

_ABORTED = frozenset({"abort", "aborted"})


class VerlServerEngine(Engine):
    """Token-in/token-out generation through a verl server manager.

    Args:
        server_manager: verl's ``LLMServerClient`` (or anything with its ``generate``).
        eos_token_ids: Ids that end a turn; used to tell a natural stop from a cut-off when
            the backend reports only ``completed`` (vLLM does, for both).

    Per-request seeds are not sent (the backends spell them differently). ``session_id`` is
    the verl ``request_id``, so a trajectory stays on one replica. :meth:`abort` is a no-op
    (verl aborts whole replicas between steps), and verl's trainer owns the weights.
    """

    def __init__(
        self,
        server_manager: Any,
        *,
        eos_token_ids: Sequence[int] = (),
        context_length: int | None = None,
        vision: bool = False,
    ) -> None:
        self.server_manager = server_manager
        self.eos_token_ids = frozenset(int(i) for i in eos_token_ids)
        self.context_length = context_length
        self.vision = vision

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        sampling = request.sampling
        params: dict[str, Any] = {
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            "repetition_penalty": 1.0,
            "logprobs": True,
            "max_tokens": sampling.max_new_tokens,
        }
        if sampling.stop:
            params["stop"] = list(sampling.stop)
        if sampling.stop_token_ids:
            params["stop_token_ids"] = list(sampling.stop_token_ids)
        rid = request.rid or uuid.uuid4().hex
        extra: dict[str, Any] = {}
        if request.image_data:
            extra["image_data"] = list(request.image_data)
        try:
            output = await self.server_manager.generate(
                request.session_id or rid,
                prompt_ids=list(request.input_ids),
                sampling_params=params,
                **extra,
            )
        except EngineError:
            raise
        except Exception as exc:  # translate verl/Ray failures at the boundary
            raise EngineError(f"verl server manager failed: {type(exc).__name__}: {exc}") from exc
        ids = tuple(int(t) for t in output.token_ids)
        log_probs = getattr(output, "log_probs", None)
        if log_probs is not None and len(log_probs) != len(ids):
            raise EngineError(
                f"verl returned {len(log_probs)} logprobs for {len(ids)} tokens (rid {rid})"
            )
        extra_fields = dict(getattr(output, "extra_fields", None) or {})
        steps = extra_fields.get("global_steps")
        return GenerateResult(
            rid=rid,
            output_ids=ids,
            output_logprobs=None if log_probs is None else tuple(float(x) for x in log_probs),
            finish_reason=self._finish(ids, getattr(output, "stop_reason", None), sampling),
            prompt_tokens=len(request.input_ids),
            completion_tokens=len(ids),
            weight_version="default" if steps is None else str(steps),
        )

    def _finish(self, ids: tuple[int, ...], reason: str | None, sampling: Any) -> FinishReason:
        """Map verl stop reasons: SGLang gives stop/length/abort, vLLM completed/aborted."""
        if reason in _ABORTED:
            return FinishReason("abort", message="aborted by verl")
        if reason == "length":
            return FinishReason("length", length=len(ids))
        stop_ids = self.eos_token_ids | set(sampling.stop_token_ids)
        if ids and ids[-1] in stop_ids:
            return FinishReason("stop", matched=ids[-1])
        if len(ids) >= sampling.max_new_tokens:
            return FinishReason("length", length=len(ids))
        return FinishReason("stop")

    async def abort(self, rid: str) -> None:
        return None

    async def abort_all(self) -> None:
        return None

    async def info(self) -> EngineInfo:
        """The context length and vision given at construction; no weight version."""
        server = ServerInfo(
            url="verl://",
            model_path=None,
            weight_version=None,
            context_length=self.context_length,
            vision=self.vision,
            engine="verl",
        )
        return EngineInfo.merge((server,))
