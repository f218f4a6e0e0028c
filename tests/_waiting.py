"""Waiting on observable state instead of sleeping for a guessed time."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable

import anyio

__all__ = ["wait_until"]


async def wait_until(
    condition: Callable[[], bool | Awaitable[bool]],
    *,
    within: float = 30.0,
    interval: float = 0.01,
    what: str = "the condition",
) -> None:
    """Poll ``condition`` (sync or async) until it holds; fail after ``within`` seconds.

    The timeout is generous on purpose: it only bounds a hang, it is never the thing tested.
    """
    try:
        with anyio.fail_after(within):
            while True:
                value = condition()
                if inspect.isawaitable(value):
                    value = await value
                if value:
                    return
                await anyio.sleep(interval)
    except TimeoutError:
        raise AssertionError(f"{what} did not hold within {within:g}s") from None
