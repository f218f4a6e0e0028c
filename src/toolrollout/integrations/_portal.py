"""The event-loop thread a synchronous trainer hook drives toolrollout's async engine on."""

from __future__ import annotations

import contextlib
from typing import Any

from anyio.from_thread import BlockingPortal, start_blocking_portal

from toolrollout.engines._base import Engine

__all__ = ["engine_at", "open_engine_portal"]


def engine_at(url: str, **options: Any) -> Engine:
    """The client of the server at ``url``, of the kind it serves (SGLang or vLLM), unopened.

    The client must be opened on the adapter's own loop, so the engine factory runs once on
    a short-lived loop of its own and a fresh client of the kind it found is returned.
    """
    from toolrollout.engines._factory import connect

    async def kind() -> type[Engine]:
        async with await connect([url], **options) as found:
            return type(found)

    with start_blocking_portal() as portal:  # a thread of its own: safe under a running loop
        cls = portal.call(kind)
    return cls([url], **options)  # type: ignore[call-arg]


def open_engine_portal(engine: Engine) -> tuple[contextlib.ExitStack, BlockingPortal]:
    """Start an anyio blocking portal (one loop thread) and open ``engine`` on it.

    Trainer hooks are synchronous, the client is bound to its loop. Closing the returned
    stack closes the engine, then stops the thread.
    """
    stack = contextlib.ExitStack()
    portal = stack.enter_context(start_blocking_portal())
    try:
        portal.call(engine.__aenter__)
    except BaseException:
        stack.close()
        raise
    stack.callback(portal.call, engine.aclose)
    return stack, portal
