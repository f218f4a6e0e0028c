"""Small loopback helpers shared by the local services (sandbox, retriever)."""

from __future__ import annotations

import anyio

__all__ = ["is_listening"]


async def is_listening(host: str, port: int) -> bool:
    """Whether something accepts TCP connections on ``host:port`` (within 2 s)."""
    try:
        with anyio.fail_after(2):
            stream = await anyio.connect_tcp(host, port)
    except (OSError, TimeoutError):
        return False
    await stream.aclose()
    return True
