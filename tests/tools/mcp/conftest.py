"""Fixtures of the MCP tests (helpers live in mcp_helpers.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from mcp_helpers import child_pids


@pytest.fixture
def no_orphans() -> Iterator[None]:
    """Fail the test if it leaves a child process behind."""
    before = child_pids()
    yield
    deadline = time.monotonic() + 5.0
    while (left := child_pids() - before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"child processes left behind: {sorted(left)}"
