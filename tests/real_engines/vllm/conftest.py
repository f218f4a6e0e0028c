"""The module-scoped real vLLM server of these tests (see ``_server.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from tests.real_engines.vllm._server import VLLMServer, run_server

from toolrollout.apps.demo import DEMO_MODEL_PATH


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    """A vLLM server with exact logprobs (processed_logprobs, float32), for the module."""
    yield from run_server(tmp_path_factory)


@pytest.fixture(scope="session")
def demo_tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(DEMO_MODEL_PATH))
