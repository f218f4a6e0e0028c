"""Shared fixtures: a tiny random-weight Qwen2 model built once per test session, and the
network guard that fails any test reaching beyond this machine (tests/_network_guard.py).

The model is small enough (two layers, hidden size 32) that a forward pass costs well under
a millisecond of compute, so tests exercise the real engine/server code paths cheaply.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._network_guard import NetworkGuard

# huggingface_hub phones home from a background thread (telemetry, its agent registry),
# which the network guard refuses: offline and silent, here and in the servers tests start.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
# wandb's OpenTelemetry reader probes its analytics server from a thread unless the process
# is offline (seen as a name lookup the guard refused, in a test after the W&B ones).
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_ERROR_REPORTING", "false")

TINY_SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world! How are you today?",
    "calculator 12 + 34 = 46 and 7 * 8 = 56",
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+2"}}\n</tool_call>',
    "<tool_response>\n3\n</tool_response>",
    "stop here STOP and there, the end.",
    "Tool-calling rollouts for reinforcement learning with SGLang.",
]
TINY_CONTEXT_LENGTH = 256


def build_tiny_model(path: Path, *, seed: int = 0) -> Path:
    """Write a byte-level BPE tokenizer and a random Qwen2ForCausalLM to ``path``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (
        GenerationConfig,
        PreTrainedTokenizerFast,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(TINY_SENTENCES * 4, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.save_pretrained(path)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=TINY_CONTEXT_LENGTH,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
        initializer_range=0.5,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(path)
    generation = GenerationConfig(eos_token_id=[tokenizer.eos_token_id])  # type: ignore[no-untyped-call]
    generation.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen2 model folder (vocab ~320, eos ``<|im_end|>``, context 256)."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"))


@pytest.fixture(scope="session", autouse=True)
def network_guard() -> Iterator[NetworkGuard]:
    """Installed before every other fixture of the session, removed after the last test."""
    guard = NetworkGuard()
    guard.install()
    try:
        yield guard
    finally:
        guard.uninstall()


@pytest.fixture(autouse=True)
def _no_network(network_guard: NetworkGuard) -> Iterator[None]:
    """Fails the test at teardown too if it reached past loopback, even if code under test
    caught the guard's failure."""
    network_guard.violations.clear()
    yield
    if network_guard.violations:
        pytest.fail("\n".join(network_guard.violations), pytrace=False)


# ---- how the suite is split over pytest-xdist workers (`pytest -n 2`, .ci/run) -----------

RAY_MODULES = frozenset(
    {
        "tests/distributed/test_ray_generate.py",
        "tests/distributed/test_ray_keys.py",
        "tests/faults/test_chaos_ray_serve.py",
        "tests/real_engines/vllm/test_ray.py",
    }
)
"""Modules that start a local Ray cluster: one worker runs them all, one cluster at a time."""
REAL_SGLANG = "tests/real_engines/sglang/"
"""Modules that share one real SGLang server per session: one worker runs them all."""
REAL_VLLM = "tests/real_engines/vllm/"
"""Modules that share one real vLLM server per session (and the module ones)."""
DOCS_PAGE_TEST = "tests/docs/test_docs_run.py::test_page_runs_as_written["
RAY_PAGES = frozenset({"docs/scale-out.md"})
"""Documentation pages whose commands start a Ray cluster (``--ray``)."""


def xdist_unit(nodeid: str) -> str:
    """The unit of work a test belongs to; a pytest-xdist worker runs each unit whole.

    A module is a unit, so its module-scoped servers start once rather than once per
    worker; the Ray tests are one unit, and so are the real-SGLang tests and the real-vLLM
    tests (one server each for them all); each documentation page is a unit of its own: the
    pages are the suite's longest tests, and one worker running all of them would finish
    minutes after the other."""
    module = nodeid.split("::", 1)[0]
    if nodeid.startswith(DOCS_PAGE_TEST):
        return "ray" if nodeid[len(DOCS_PAGE_TEST) : -1] in RAY_PAGES else nodeid
    if module in RAY_MODULES:  # before the engine folders: one Ray cluster at a time
        return "ray"
    for engine_tests in (REAL_SGLANG, REAL_VLLM):
        if module.startswith(engine_tests):
            return engine_tests
    return module


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: without the plugin, never called
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Units from :func:`xdist_unit` (xdist's ``loadgroup`` would do this with marks, but
    pytest 9 ignores the node id it rewrites, so it splits modules; this is called only
    when the suite runs on workers, where pytest-xdist is installed)."""
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return xdist_unit(nodeid)

    return UnitScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a pytest-xdist worker, the long units first: the pages, then units with a slow
    test, then the rest in collection order, so that the many fast units fill in at the end
    and the two workers finish close together (``--no-loadscope-reorder`` in pyproject's
    addopts keeps this order; xdist's own sorts by the number of tests, which put the pages,
    one test each, last). A run in one process keeps the collection order."""
    if not hasattr(config, "workerinput"):
        return
    rank: dict[str, int] = {}
    for item in items:
        unit = xdist_unit(item.nodeid)
        own = (
            0
            if item.nodeid.startswith(DOCS_PAGE_TEST)
            else 1
            if item.get_closest_marker("slow")
            else 2
        )
        rank[unit] = min(rank.get(unit, 2), own)
    items.sort(key=lambda item: rank[xdist_unit(item.nodeid)])
