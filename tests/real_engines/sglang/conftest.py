"""Real SGLang servers for the tests in this folder (marker ``real_engine``).

``sglang_fp32`` is one server per test session, float32 as logprob parity needs, with
priority scheduling on; tests that change its state (pause, weights) restore it.
``start_sglang`` starts others (another dtype, other flags) for as long as a test or
module holds them. tests/conftest.py runs this folder on one pytest-xdist worker, so the
session's server starts once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from tests.real_engines.sglang._launch import SGLangServer, require_sglang, sglang_server

FP32_ARGS = ("--enable-priority-scheduling",)
"""The shared server's extra flags: priority scheduling, which toolrollout's scheduling
policies use (docs/scheduling.md); without a priority a request gets the lowest."""


@pytest.fixture(scope="session")
def sglang_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sglang-logs")


@pytest.fixture(scope="session")
def sglang_fp32(sglang_logs: Path) -> Iterator[SGLangServer]:
    """The session's real SGLang server: the demo model in float32."""
    require_sglang()
    with sglang_server(sglang_logs, dtype="float32", extra_args=FP32_ARGS) as server:
        yield server


@pytest.fixture(scope="session")
def start_sglang(
    sglang_logs: Path,
) -> Callable[..., AbstractContextManager[SGLangServer]]:
    """``with start_sglang(dtype="auto", extra_args=[...]) as server:`` another server."""
    require_sglang()

    def start(**kwargs: Any) -> AbstractContextManager[SGLangServer]:
        return sglang_server(sglang_logs, **kwargs)

    return start
