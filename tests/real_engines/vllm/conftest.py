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
def vllm_untied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    """The demo model with its output head as a tensor of its own (the same weights), which
    vLLM's CPU build can reload in place; one server for the session (the vLLM tests are
    one xdist unit). test_vllm_rollouts.py, the last module, restarts it in raw_logprobs
    mode and ends with a failed reload: no module may use it after that one."""
    yield from run_server(tmp_path_factory, untied=True)


@pytest.fixture(scope="session")
def demo_tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(DEMO_MODEL_PATH))
