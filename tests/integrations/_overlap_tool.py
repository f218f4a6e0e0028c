"""A calculator that records how many of its calls run at once (for the verl limit test)."""

from __future__ import annotations

import anyio

from toolrollout.tools.calculator import calculator as _calculator

running = 0
most_at_once = 0
calls = 0


async def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return the result.

    Args:
        expression: Arithmetic with + - * / // % ** and parentheses, e.g. 3 * (4 + 5)
    """
    global running, most_at_once, calls
    running += 1
    calls += 1
    most_at_once = max(most_at_once, running)
    try:
        await anyio.sleep(0.3)  # long enough for concurrent samples' calls to meet
        return _calculator(expression)
    finally:
        running -= 1
