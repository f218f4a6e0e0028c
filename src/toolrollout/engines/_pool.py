"""The size of an engine client's connection pool: enough connections for the run's
requests in flight plus the control plane, within the process's open-file limit.
"""

from __future__ import annotations

import logging

import httpx

from .._exceptions import UserError
from .._net import open_file_limit

__all__ = [
    "CONTROL_CONNECTIONS",
    "DEFAULT_LIMITS",
    "DEFAULT_TIMEOUT",
    "FILE_RESERVE",
    "connection_limits",
    "fit_open_files",
]

logger = logging.getLogger("toolrollout.engines")

DEFAULT_TIMEOUT = httpx.Timeout(600.0, connect=10.0)
"""10 s to connect; 600 s to read, since one long generation is silent until it ends."""

DEFAULT_LIMITS = httpx.Limits(max_connections=1024, max_keepalive_connections=16)
"""Enough connections for thousands of concurrent rollouts against a handful of servers
(``max_keepalive_connections`` applies to an httpx transport only)."""

CONTROL_CONNECTIONS = 64
"""Connections beside the generate requests, for the control plane (health, load, aborts)."""

FILE_RESERVE = 256
"""Descriptors left to the rest of the process (files, pipes, tool services' sockets)."""


def connection_limits(concurrency: int) -> httpx.Limits:
    """Pool limits for ``concurrency`` generate requests in flight at once.

    A request beyond the pool's size waits unseen by the server and by any scheduling
    policy; never below :data:`DEFAULT_LIMITS`.
    """
    if concurrency < 1:
        raise UserError(f"concurrency must be at least 1, got {concurrency}")
    floor = DEFAULT_LIMITS.max_connections or 0
    return httpx.Limits(
        max_connections=max(floor, concurrency + CONTROL_CONNECTIONS),
        max_keepalive_connections=DEFAULT_LIMITS.max_keepalive_connections,
        keepalive_expiry=DEFAULT_LIMITS.keepalive_expiry,
    )


def fit_open_files(limits: httpx.Limits, who: str) -> httpx.Limits:
    """``limits`` with the open-file limit raised to hold them, or capped (and said so)
    where the hard limit is lower: a connection past it fails with "too many open files"."""
    connections = limits.max_connections
    if connections is None:
        return limits
    room = open_file_limit(connections + FILE_RESERVE) - FILE_RESERVE
    if room >= connections:
        return limits
    capped = max(room, 1)
    logger.warning(
        "%s: a pool of %d connections needs %d open files, but the limit is %d; "
        "the pool is capped at %d (raise the hard limit, `ulimit -Hn`, for more)",
        who,
        connections,
        connections + FILE_RESERVE,
        room + FILE_RESERVE,
        capped,
    )
    return httpx.Limits(
        max_connections=capped,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
    )
