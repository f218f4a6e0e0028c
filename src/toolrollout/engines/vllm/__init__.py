"""The async HTTP engine for vLLM's token API: :class:`VLLMClient`.

``_client`` holds the control plane and the checks vLLM needs (logprob mode, checkpoint
layout before a reload, a failed reload as a dead server), ``_wire`` the token API's
request and answer shapes. The machinery is :mod:`toolrollout.engines._http_client`'s,
shared with the SGLang client.
"""

from __future__ import annotations

from ._client import LOGPROBS_FLAG as LOGPROBS_FLAG
from ._client import VLLMClient as VLLMClient

__all__ = ["LOGPROBS_FLAG", "VLLMClient"]
