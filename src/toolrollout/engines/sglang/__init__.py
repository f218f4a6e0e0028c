"""The async HTTP engine for SGLang's native API: :class:`SGLangClient`.

``_client`` holds SGLang's wire format and its batch, ``n`` and streaming calls, and
``_control`` the control plane shared in name and types with every
:class:`~toolrollout.engines.Engine` (info, pause/continue, weight updates, cache flush).
The machinery both send through (pool, routing, retries, abort by id, start-up) is
:mod:`toolrollout.engines._http_client`'s, shared with the vLLM client.
"""

from __future__ import annotations

from .._routing import ServerStats as ServerStats
from .._transport import ENGINE_RETRY as ENGINE_RETRY
from .._transport import RetryPolicy as RetryPolicy
from .._types import StreamChunk as StreamChunk
from ._client import DEFAULT_LIMITS as DEFAULT_LIMITS
from ._client import DEFAULT_TIMEOUT as DEFAULT_TIMEOUT
from ._client import ClientStats as ClientStats
from ._client import SGLangClient as SGLangClient
from ._client import connection_limits as connection_limits

__all__ = [
    "DEFAULT_LIMITS",
    "DEFAULT_TIMEOUT",
    "ENGINE_RETRY",
    "ClientStats",
    "RetryPolicy",
    "SGLangClient",
    "ServerStats",
    "StreamChunk",
    "connection_limits",
]
