"""The engine seam: everything that turns token ids into generated token ids.

``SGLangClient`` and ``VLLMClient`` talk HTTP to servers, ``EmbeddedEngine`` runs a Hugging
Face model in-process (imported lazily: it needs torch), ``toolrollout.testing`` replays
scripted outputs; all implement :class:`Engine`. :class:`SchedulingConfig` switches on the
client-side scheduling policies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._base import Engine as Engine
from ._control import EngineInfo as EngineInfo
from ._control import EngineServersFailed as EngineServersFailed
from ._control import PauseMode as PauseMode
from ._control import ServerInfo as ServerInfo
from ._control import ServerWeightUpdate as ServerWeightUpdate
from ._control import WeightUpdate as WeightUpdate
from ._priority import WorkHistory as WorkHistory
from ._scheduling import SchedulingConfig as SchedulingConfig
from ._types import FinishReason as FinishReason
from ._types import GenerateRequest as GenerateRequest
from ._types import GenerateResult as GenerateResult
from ._types import SamplingParams as SamplingParams
from ._types import TokenRuns as TokenRuns
from .sglang import ENGINE_RETRY as ENGINE_RETRY
from .sglang import ClientStats as ClientStats
from .sglang import RetryPolicy as RetryPolicy
from .sglang import ServerStats as ServerStats
from .sglang import SGLangClient as SGLangClient
from .sglang import StreamChunk as StreamChunk
from .sglang import connection_limits as connection_limits
from .vllm import VLLMClient as VLLMClient

if TYPE_CHECKING:
    from .embedded import EmbeddedEngine as EmbeddedEngine

__all__ = [
    "ENGINE_RETRY",
    "ClientStats",
    "EmbeddedEngine",
    "Engine",
    "EngineInfo",
    "EngineServersFailed",
    "FinishReason",
    "GenerateRequest",
    "GenerateResult",
    "PauseMode",
    "RetryPolicy",
    "SGLangClient",
    "SamplingParams",
    "SchedulingConfig",
    "ServerInfo",
    "ServerStats",
    "ServerWeightUpdate",
    "StreamChunk",
    "TokenRuns",
    "VLLMClient",
    "WeightUpdate",
    "WorkHistory",
    "connection_limits",
]


def __getattr__(name: str) -> Any:
    if name == "EmbeddedEngine":
        from .embedded import EmbeddedEngine

        return EmbeddedEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
