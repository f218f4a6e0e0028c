"""The module-scoped real vLLM server of these tests (see ``_server.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.real_engines.vllm._server import VLLMServer, run_server


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    """A vLLM server with exact logprobs (processed_logprobs, float32), for the module."""
    yield from run_server(tmp_path_factory)
