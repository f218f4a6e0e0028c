"""The async HTTP engine for SGLang's native API: :class:`SGLangClient`.

``_client`` holds the wire format and the batch, ``n`` and streaming calls, ``_control`` the
control plane; the machinery is :mod:`toolrollout.engines._http_client`'s.
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
