"""The tool the latency-model workload scripts call, shared by the tests that run it.

The stand-in server's scripted turns call ``bench._script.TOOL_NAME`` with a ``key``; a test
that runs real rollouts against it needs a tool of that name and schema.
"""

from __future__ import annotations

from toolrollout.apps.bench._script import TOOL_NAME
from toolrollout.tools import function_tool

__all__ = ["lookup"]


@function_tool(name=TOOL_NAME)
async def lookup(key: str) -> str:
    """Look up a record.

    Args:
        key: the record key.
    """
    return f"record {key}"
