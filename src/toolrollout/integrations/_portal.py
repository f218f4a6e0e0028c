"""The event-loop thread a synchronous trainer hook drives toolrollout's async engine on."""

from __future__ import annotations

import contextlib

from anyio.from_thread import BlockingPortal, start_blocking_portal

from toolrollout.engines._base import Engine

__all__ = ["open_engine_portal"]


def open_engine_portal(engine: Engine) -> tuple[contextlib.ExitStack, BlockingPortal]:
    """Start an anyio blocking portal (one loop thread) and open ``engine`` on it.

    Trainer hooks (TRL's ``rollout_func``, ms-swift's callbacks) are synchronous, while the
    engine's client is bound to the loop it was opened on; so each adapter owns one such
    thread for its whole life. Closing the returned stack closes the engine on that loop,
    then stops the thread; a failure while opening leaves nothing running.
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
