"""The engine seam: one small interface behind which every backend sits.

The rollout loop only ever talks to :class:`Engine`. Three implementations exist: the HTTP
client for SGLang-compatible servers (``SGLangClient``), the in-process embedded engine
(``EmbeddedEngine``) and the scripted engine for tests (``toolrollout.testing``).

``Engine`` has two planes. The data plane (``generate``, ``generate_stream``, ``abort``)
is what a rollout (and the gateway's streamed answers) needs. The control plane
(``info``, ``pause_generation``, ``continue_generation``, ``update_weights_from_disk``,
``flush_cache``, ``abort_all``) is what a trainer and the command line need; it has the
same names, arguments and return types on every engine, so no caller has to probe an
engine with ``hasattr``.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator
from typing import Self

from .._exceptions import UserError
from ._control import EngineInfo, PauseMode, WeightUpdate
from ._types import GenerateRequest, GenerateResult, SamplingParams, StreamChunk

__all__ = ["Engine"]


class Engine(ABC):
    """Token-in/token-out generation with abort, plus one control plane.

    ``generate``, ``abort``, ``info`` and ``abort_all`` are abstract: every engine can
    describe what it serves and stop its own requests. The weight-sync calls
    (``pause_generation``, ``continue_generation``, ``update_weights_from_disk``,
    ``flush_cache``) raise :class:`UserError` by default, for engines whose weights are
    owned by someone else (e.g. verl's server manager); the shipped engines implement them.
    """

    # ------------------------------------------------------------------ data plane
    @abstractmethod
    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Generate one sample for ``request`` (``request.sampling.n`` must be 1)."""

    async def generate_stream(self, request: GenerateRequest) -> AsyncGenerator[StreamChunk, None]:
        """Generate one sample as cumulative :class:`StreamChunk` s while it is decoded.

        Every chunk holds all ids (and logprobs) so far; the last one has ``.result``,
        the same :class:`GenerateResult` :meth:`generate` returns for the request (same
        ids, logprobs and weight version), so a caller records one or the other alike.
        Closing the iterator early aborts the request. ``request.sampling.n`` must be 1.

        The default yields only the final chunk (an engine that cannot stream still
        serves streaming callers, just later): the vLLM client uses it; the SGLang client
        and the embedded engine stream per step.
        """
        result = await self.generate(request)
        yield StreamChunk.final(result)

    @abstractmethod
    async def abort(self, rid: str) -> None:
        """Abort a running request; its ``generate`` call returns the partial output."""

    # ------------------------------------------------------------------ control plane
    @abstractmethod
    async def info(self) -> EngineInfo:
        """What the engine serves: context length, vision, model path, weight version."""

    @abstractmethod
    async def abort_all(self) -> None:
        """Abort every request this engine object has in flight.

        Each pending ``generate`` returns its partial output with ``finish_reason.type ==
        "abort"``. Only this engine's own requests are stopped (a shared SGLang server's
        other clients are not touched). Used on shutdown.
        """

    async def logprob_mismatch(self, sampling: SamplingParams) -> str | None:
        """Why the logprobs this engine returns for ``sampling`` are not the log-probabilities
        a trainer recomputes from the checkpoint for the tokens sampled, or None.

        One line naming the setting that fixes it (SGLang serving a float32 checkpoint in
        float16: ``--dtype float32``). The runner asks once, at the start of a run, and
        refuses or labels the run (``RolloutConfig.inexact_logprobs``). The default is None:
        an engine that cannot tell says nothing; the shipped engines check what they can.
        """
        return None

    async def pause_generation(self, mode: PauseMode = "abort") -> None:
        """Stop generating until :meth:`continue_generation` (before swapping weights).

        ``abort`` ends running requests with their partial output (``finish_reason``
        ``abort``); ``retract`` and ``in_place`` keep them and resume them afterwards.
        New ``generate`` calls wait until :meth:`continue_generation`.
        """
        raise self._unsupported("pause_generation")

    async def continue_generation(self) -> None:
        """Undo :meth:`pause_generation`: kept requests resume, waiting calls start."""
        raise self._unsupported("continue_generation")

    async def update_weights_from_disk(
        self,
        model_path: str | os.PathLike[str],
        *,
        weight_version: str | None = None,
        abort_all_requests: bool = False,
    ) -> WeightUpdate:
        """Load the weights in ``model_path`` (a path where the model runs) and serve them.

        Running requests finish on the old weights first unless ``abort_all_requests``
        (or the engine is paused: then they continue on the new weights). New requests
        wait meanwhile. ``weight_version`` becomes the label of every later result and of
        :meth:`info`; without it the label stays. A refused update raises and leaves the
        old weights in place.
        """
        raise self._unsupported("update_weights_from_disk")

    async def flush_cache(self) -> bool:
        """Drop the prefix cache (after a weight update); False when refused.

        SGLang refuses while requests are running or waiting, and so does every engine
        here: the answer is False then, and nothing was flushed.
        """
        raise self._unsupported("flush_cache")

    def _unsupported(self, what: str) -> UserError:
        return UserError(
            f"{type(self).__name__} does not support {what}: its weights are managed "
            "outside toolrollout"
        )

    # ------------------------------------------------------------------ lifecycle
    async def aclose(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release connections, threads and models."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
