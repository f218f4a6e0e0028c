"""The event-loop thread a synchronous trainer hook drives toolrollout's async engine on."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from anyio.from_thread import BlockingPortal, start_blocking_portal

from toolrollout.engines._base import Engine

__all__ = ["EnginePortal", "engine_at"]

T = TypeVar("T")


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


class EnginePortal:
    """``engine``, opened on an anyio blocking portal (one loop thread) at the first
    :meth:`portal`: trainer hooks are synchronous, the client is bound to its loop.

    ``opened(stack, portal)`` may enter more on the loop once the engine is open (the tools'
    services). :meth:`close` closes what was entered, then the engine, then stops the thread.
    """

    def __init__(
        self,
        engine: Engine,
        opened: Callable[[contextlib.ExitStack, BlockingPortal], object] | None = None,
    ) -> None:
        self.engine = engine
        self._opened = opened
        self._stack: contextlib.ExitStack | None = None
        self._portal: BlockingPortal | None = None

    def portal(self) -> BlockingPortal:
        if self._portal is None:
            stack = contextlib.ExitStack()
            try:
                portal = stack.enter_context(start_blocking_portal())
                portal.call(self.engine.__aenter__)
                stack.callback(portal.call, self.engine.aclose)
                if self._opened is not None:
                    self._opened(stack, portal)
            except BaseException:
                stack.close()
                raise
            self._stack, self._portal = stack, portal
        return self._portal

    def call(self, fn: Callable[[], Awaitable[T]]) -> T:
        return self.portal().call(fn)

    def close(self) -> None:
        stack, self._stack, self._portal = self._stack, None, None
        if stack is not None:
            stack.close()
