"""The async HTTP engine for SGLang's native API: :class:`SGLangClient`.

``_client`` holds the data plane (generate, batch, n samples, stream) and abort,
``_control`` the control plane shared in name and types with every
:class:`~toolrollout.engines.Engine` (info, pause/continue, weight updates, cache flush,
start-up), and ``_transport`` the transport and retry plumbing both send through.
"""

from __future__ import annotations

from .._routing import ServerStats as ServerStats
from .._wire import StreamChunk as StreamChunk
from ._client import DEFAULT_LIMITS as DEFAULT_LIMITS
from ._client import DEFAULT_TIMEOUT as DEFAULT_TIMEOUT
from ._client import ClientStats as ClientStats
from ._client import SGLangClient as SGLangClient
from ._client import connection_limits as connection_limits
from ._transport import ENGINE_RETRY as ENGINE_RETRY
from ._transport import RetryPolicy as RetryPolicy

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
