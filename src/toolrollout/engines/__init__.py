"""The engine seam: everything that turns token ids into generated token ids.

``SGLangClient`` talks HTTP to SGLang-compatible servers (real SGLang, sglang-router,
``toolrollout serve``), ``VLLMClient`` to vLLM servers (its token API);
``EmbeddedEngine`` runs a Hugging Face model in-process on a CPU (imported lazily,
because it needs torch); ``toolrollout.testing.ScriptedEngine`` replays
scripted outputs for tests. All of them implement :class:`Engine`: the data plane
(``generate``, ``abort``) and one control plane with the same names and return types
(``info`` -> :class:`EngineInfo`, ``pause_generation``, ``continue_generation``,
``update_weights_from_disk`` -> :class:`WeightUpdate`, ``flush_cache`` -> bool,
``abort_all``). :class:`SchedulingConfig` switches on the client-side scheduling policies
(request priority, adaptive admission from the servers' load or the client's loop lag,
oldest groups first, GRPO group affinity, priority from a prompt's :class:`WorkHistory`)
that ``RolloutConfig.scheduling`` applies to every request.
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
