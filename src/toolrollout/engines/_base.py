"""The engine seam: one small interface behind which every backend sits.

The data plane (``generate``, ``generate_stream``, ``abort``) is what a rollout needs; the
control plane is what a trainer and the command line need, with the same names, arguments
and return types on every engine, so no caller has to probe an engine with ``hasattr``.
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

    The weight-sync calls raise :class:`UserError` by default, for engines whose weights are
    owned by someone else (e.g. verl's server manager).
    """

    # ------------------------------------------------------------------ data plane
    @abstractmethod
    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Generate one sample for ``request`` (``request.sampling.n`` must be 1)."""

    async def generate_stream(self, request: GenerateRequest) -> AsyncGenerator[StreamChunk, None]:
        """Generate one sample as cumulative :class:`StreamChunk` s while it is decoded.

        The last chunk's ``.result`` is what :meth:`generate` returns for the request.
        Closing the iterator early aborts the request. The default yields only the final
        chunk (the vLLM client uses it).
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
        """Abort every request this engine object has in flight (not a shared server's
        other clients'); each pending ``generate`` returns its partial output."""

    async def logprob_mismatch(self, sampling: SamplingParams) -> str | None:
        """One line naming why (and the setting that fixes it) when this engine's logprobs for
        ``sampling`` are not what a trainer recomputes from the checkpoint; else None."""
        return None

    async def pause_generation(self, mode: PauseMode = "abort") -> None:
        """Stop generating until :meth:`continue_generation` (before swapping weights).

        ``abort`` ends running requests with their partial output; ``retract`` and
        ``in_place`` keep them. New ``generate`` calls wait meanwhile.
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

        Running requests finish on the old weights first unless ``abort_all_requests`` (or
        the engine is paused); new requests wait. ``weight_version`` labels later results.
        A refused update raises and leaves the old weights in place.
        """
        raise self._unsupported("update_weights_from_disk")

    async def flush_cache(self) -> bool:
        """Drop the prefix cache (after a weight update); False when refused, as while
        requests are running or waiting."""
        raise self._unsupported("flush_cache")

    @staticmethod
    def _check_pause_mode(mode: str) -> None:
        if mode not in ("abort", "retract", "in_place"):
            raise UserError(f"pause mode must be abort, retract or in_place, got {mode!r}")

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
