"""The engine seam: everything that turns token ids into generated token ids.

``SGLangClient`` talks HTTP to SGLang-compatible servers (real SGLang, sglang-router,
``toolrollout serve``); ``EmbeddedEngine`` runs a Hugging Face model in-process on a CPU
(imported lazily, because it needs torch); ``toolrollout.testing.ScriptedEngine`` replays
scripted outputs for tests. All three implement :class:`Engine`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._base import Engine as Engine
from ._types import FinishReason as FinishReason
from ._types import GenerateRequest as GenerateRequest
from ._types import GenerateResult as GenerateResult
from ._types import SamplingParams as SamplingParams
from .sglang import ClientStats as ClientStats
from .sglang import RetryPolicy as RetryPolicy
from .sglang import ServerStats as ServerStats
from .sglang import SGLangClient as SGLangClient
from .sglang import StreamChunk as StreamChunk

if TYPE_CHECKING:
    from .embedded import EmbeddedEngine as EmbeddedEngine

__all__ = [
    "ClientStats",
    "EmbeddedEngine",
    "Engine",
    "FinishReason",
    "GenerateRequest",
    "GenerateResult",
    "RetryPolicy",
    "SGLangClient",
    "SamplingParams",
    "ServerStats",
    "StreamChunk",
]


def __getattr__(name: str) -> Any:
    if name == "EmbeddedEngine":
        from .embedded import EmbeddedEngine

        return EmbeddedEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
