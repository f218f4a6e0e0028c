"""The async HTTP engine for vLLM's token API: :class:`VLLMClient`.

``_client`` holds the control plane, ``_wire`` the token API's request and answer shapes.
"""

from __future__ import annotations

from ._client import LOGPROBS_FLAG as LOGPROBS_FLAG
from ._client import VLLMClient as VLLMClient

__all__ = ["LOGPROBS_FLAG", "VLLMClient"]
