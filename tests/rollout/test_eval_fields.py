"""What evaluation reads off a trajectory: its data_source and the time split of its run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pyarrow.parquet as pq

from toolrollout.rewards import numeric_match
from toolrollout.rollout import RolloutRunner, TrajectoryStatus, read_rows, write_trajectories
from toolrollout.testing import ScriptedEngine, ScriptedOutput
from toolrollout.tools import function_tool

CALL = '<tool_call>\n{"name": "slow_add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>'


async def test_data_source_and_seconds_are_recorded(demo_tokenizer: Any, tmp_path: Path) -> None:
    @function_tool
    async def slow_add(a: int, b: int) -> str:
        """Add two integers, slowly.

        Args:
            a: first term
            b: second term
        """
        await anyio.sleep(0.2)
        return str(a + b)

    def out(text: str, delay: float) -> ScriptedOutput:
        ids = demo_tokenizer.encode(text, add_special_tokens=False)
        return ScriptedOutput(ids, logprobs=[-0.1] * len(ids), delay=delay)

    engine = ScriptedEngine([out(CALL, 0.1), out("It is 5.<|im_end|>", 0.1)])
    runner = RolloutRunner(engine, demo_tokenizer, [slow_add], rewards=[numeric_match])
    row = {
        "messages": [{"role": "user", "content": "2 + 3?"}],
        "answer": "5",
        "data_source": "arith",
    }
    [traj] = await runner.run([row])
    assert traj.status is TrajectoryStatus.COMPLETED, traj.error
    assert traj.data_source == "arith"
    m = traj.metrics
    assert m["generation_seconds"] >= 0.2
    assert m["tool_seconds"] >= 0.2
    assert m["total_seconds"] >= m["generation_seconds"] + m["tool_seconds"]

    path = write_trajectories([traj], tmp_path / "t.parquet")
    assert pq.read_table(path).column("data_source").to_pylist() == ["arith"]
    [back] = read_rows(path)
    assert back["data_source"] == "arith"
    assert back["metrics"]["total_seconds"] == m["total_seconds"]


async def test_rows_without_data_source_keep_a_null(demo_tokenizer: Any, tmp_path: Path) -> None:
    ids = demo_tokenizer.encode("Hi.<|im_end|>", add_special_tokens=False)
    engine = ScriptedEngine([ScriptedOutput(ids)])
    [traj] = await RolloutRunner(engine, demo_tokenizer, []).run(
        [[{"role": "user", "content": "hello"}]]
    )
    assert traj.data_source is None
    path = write_trajectories([traj], tmp_path / "t.jsonl")
    assert json.loads(path.read_text())["data_source"] is None
