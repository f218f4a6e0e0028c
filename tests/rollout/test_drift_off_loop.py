"""The end-of-trajectory drift check runs on a worker thread when the tokenizer allows it.

Re-tokenizing a whole conversation is most of a long trajectory's last step, and a Rust
tokenizer called directly releases the GIL while it encodes; on the event loop's thread
the check would stall every other trajectory (docs/benchmarks.md, third round).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from toolrollout import RolloutRunner
from toolrollout._records import TrajectoryStatus
from toolrollout.chat import ChatFormat
from toolrollout.rollout import _drift
from toolrollout.testing import ScriptedEngine
from toolrollout.tools import calculator_tool

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 3"}}\n'
OUTPUTS = [f"{CALL}</tool_call><|im_end|>", "It is 5.<|im_end|>"]


async def _run_and_watch(
    demo_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> tuple[Any, set[int]]:
    threads: set[int] = set()
    original = _drift.DriftLedger.final_check

    def watched(self: _drift.DriftLedger, view: Any) -> None:
        threads.add(threading.get_ident())
        original(self, view)

    monkeypatch.setattr(_drift.DriftLedger, "final_check", watched)
    engine = ScriptedEngine([demo_tokenizer.encode(t, add_special_tokens=False) for t in OUTPUTS])
    runner = RolloutRunner(engine, demo_tokenizer, [calculator_tool()])
    (trajectory,) = await runner.run([{"messages": [{"role": "user", "content": "2 + 3?"}]}])
    assert trajectory.status is TrajectoryStatus.COMPLETED, trajectory.error
    return trajectory, threads


async def test_a_rust_tokenizer_checks_drift_on_a_worker_thread(
    demo_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    trajectory, threads = await _run_and_watch(demo_tokenizer, monkeypatch)
    assert threads and threading.get_ident() not in threads
    # the check ran and found the transcript exact, as on the loop
    assert trajectory.metrics["drift_mismatches"] == 0


def test_a_backend_with_state_set_does_not_encode_off_the_loop(demo_tokenizer: Any) -> None:
    """transformers leaves truncation set on the shared backend after a call that asked for
    it; such a tokenizer goes through ``tokenizer.encode``, which is not thread-safe."""
    chat = ChatFormat(demo_tokenizer)
    assert chat.encodes_without_the_gil
    backend = demo_tokenizer._tokenizer
    backend.enable_truncation(100_000)
    try:
        assert not chat.encodes_without_the_gil
    finally:
        backend.no_truncation()
    assert chat.encodes_without_the_gil


async def test_otherwise_the_check_runs_on_the_loop(
    demo_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ChatFormat, "encodes_without_the_gil", property(lambda self: False))
    trajectory, threads = await _run_and_watch(demo_tokenizer, monkeypatch)
    assert threads == {threading.get_ident()}
    assert trajectory.metrics["drift_mismatches"] == 0
