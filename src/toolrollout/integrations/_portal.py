"""The event-loop thread a synchronous trainer hook drives toolrollout's async engine on."""

from __future__ import annotations

import contextlib
from typing import Any

from anyio.from_thread import BlockingPortal, start_blocking_portal

from toolrollout.engines._base import Engine

__all__ = ["engine_at", "open_engine_portal"]


def engine_at(url: str, **options: Any) -> Engine:
    """The client of the server at ``url``, of the kind it serves (SGLang or vLLM), unopened.

    A trainer hook names its engine by URL before any event loop runs, and its client must
    be opened on the adapter's own loop (:func:`open_engine_portal`). So the engine factory
    (:func:`~toolrollout.engines._factory.connect`: health, kind, one line for a wrong URL)
    runs once on a short-lived loop of its own, and a fresh client of the kind it found is
    returned; ``options`` go to both.
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
