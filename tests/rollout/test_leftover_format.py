"""The leftover file format: versioned JSON, readable across field changes, format 1 too.

Trajectories come from the real loop against a scripted engine (so they carry a tool turn,
a drift checkpoint and an open turn cut by an abort); the file is read back and resumed.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from toolrollout._exceptions import UserError
from toolrollout.engines import FinishReason, SamplingParams
from toolrollout.rollout import (
    RolloutConfig,
    RolloutRunner,
    Trajectory,
    TrajectoryStatus,
    _leftover,
    read_leftover,
    write_leftover,
)
from toolrollout.testing import ScriptedEngine, ScriptedOutput
from toolrollout.tools import ToolContext, calculator_tool, function_tool

FORMAT1 = Path(__file__).parent / "data" / "leftover_format1.parquet"
"""Written by toolrollout before format 2 (the pickled format), with the script of
:func:`leg_one`: group g0 aborted mid-answer after a calculator turn, g1 completed."""

PROMPT = {"messages": [{"role": "user", "content": "What is 2 + 3?"}], "answer": "5"}
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 3"}}\n</tool_call>'


def ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def runner(engine: ScriptedEngine, tokenizer: Any) -> RolloutRunner:
    config = RolloutConfig(n=1, seed=5, sampling=SamplingParams(max_new_tokens=64))
    return RolloutRunner(engine, tokenizer, [calculator_tool()], config=config)


async def leg_one(tokenizer: Any) -> list[Trajectory]:
    """An aborted trajectory (float64 logprobs float32 cannot hold) and a finished one."""
    call = ids(tokenizer, CALL + "<|im_end|>")
    part = ids(tokenizer, "The answer")
    done = ids(tokenizer, "5<|im_end|>")
    engine = ScriptedEngine(
        [
            ScriptedOutput(call, logprobs=[-0.125 - i / 1e6 for i in range(len(call))]),
            ScriptedOutput(
                part,
                logprobs=[-0.3 - i / 7 for i in range(len(part))],
                finish_reason=FinishReason(type="abort", message="Aborted"),
                weight_version="v1",
            ),
            ScriptedOutput(done, logprobs=[-0.5] * len(done)),
        ]
    )
    rollout = runner(engine, tokenizer)
    return [
        *await rollout.run([PROMPT], group_ids=["g0"]),
        *await rollout.run([PROMPT], group_ids=["g1"]),
    ]


async def leg_two(tokenizer: Any, saved: list[Trajectory]) -> tuple[list[Trajectory], Any]:
    rest = ids(tokenizer, " is 5.<|im_end|>")
    engine = ScriptedEngine([ScriptedOutput(rest, logprobs=[-0.0625] * len(rest))])
    batch = await runner(engine, tokenizer).resume(saved)
    return sorted(batch.trajectories, key=lambda t: t.uid), engine.requests


def rewrite_states(path: Path, out: Path, change: Any, meta: Any = None) -> Path:
    """Copy a leftover file with ``change(state_dict)`` applied to each row's JSON."""
    table = pq.read_table(path)
    states = [json.loads(blob) for blob in table.column("state").to_pylist()]
    for state in states:
        change(state)
    column = table.schema.get_field_index("state")
    blobs = pa.array([json.dumps(s).encode() for s in states], pa.binary())
    table = table.set_column(column, "state", blobs)
    if meta is not None:
        key = b"toolrollout.leftover"
        info = json.loads(table.schema.metadata[key])
        table = table.replace_schema_metadata({key: json.dumps(meta(info)).encode()})
    pq.write_table(table, out)
    return out


async def test_round_trip_resumes_token_for_token(demo_tokenizer: Any, tmp_path: Path) -> None:
    saved = await leg_one(demo_tokenizer)
    aborted = saved[0]
    assert aborted.status is TrajectoryStatus.ABORTED and aborted.resume_point is not None
    path = write_leftover(saved, tmp_path / "left.parquet", info={"n": 1})
    loaded, info = read_leftover(path)
    assert info == {"n": 1}
    assert loaded == saved  # every field: spans, float64 logprobs, messages, metrics...
    assert loaded[0].rollout_logprobs == aborted.rollout_logprobs
    assert loaded[0].resume_point == aborted.resume_point
    # The file holds JSON, no pickle.
    blob = pq.read_table(path).column("state").to_pylist()[0]
    assert json.loads(blob)["leftover_format_version"] == 2
    # Resuming the loaded copy and the in-memory one gives the same tokens.
    from_memory, _ = await leg_two(demo_tokenizer, saved)
    from_file, requests = await leg_two(demo_tokenizer, loaded)
    [request] = requests
    assert list(request.input_ids) == list(aborted.prompt_ids) + aborted.response_ids
    for a, b in zip(from_memory, from_file, strict=True):
        assert (a.response_ids, a.loss_mask, a.rollout_logprobs) == (
            b.response_ids,
            b.loss_mask,
            b.rollout_logprobs,
        )
        assert a.messages == b.messages and a.status == b.status
    done = from_file[0]
    assert done.status is TrajectoryStatus.COMPLETED and done.metrics["resumes"] == 1
    assert done.response_ids[: len(aborted.response_ids)] == aborted.response_ids
    assert done.rollout_logprobs[: len(aborted.response_ids)] == aborted.rollout_logprobs
    assert done.num_turns == 2 and done.reward == 1.0  # "auto": numeric_match on the truth


async def test_renamed_unknown_and_missing_keys_still_load(
    demo_tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    saved = await leg_one(demo_tokenizer)
    path = write_leftover(saved, tmp_path / "left.parquet")

    def change(state: dict[str, Any]) -> None:
        trajectory = state["trajectory"]
        trajectory["turns"] = trajectory.pop("num_turns")  # a field renamed since
        trajectory["added_later"] = {"x": 1}  # a newer writer's extra field
        del trajectory["data_source"], trajectory["tool_final_rewards"]  # optional: defaulted
        state["also_new"] = True
        if state["resume_point"] is not None:
            state["resume_point"]["state"]["counters"]["added_later"] = 3
            state["resume_point"]["state"]["new_section"] = {}
            del state["resume_point"]["state"]["vision"]

    changed = rewrite_states(path, tmp_path / "changed.parquet", change)
    monkeypatch.setattr(_leftover, "_RENAMED", {"turns": "num_turns"})
    loaded, _ = read_leftover(changed)
    assert loaded == saved
    resumed, _ = await leg_two(demo_tokenizer, loaded)
    assert resumed[0].status is TrajectoryStatus.COMPLETED


async def test_a_newer_version_is_a_one_line_error(demo_tokenizer: Any, tmp_path: Path) -> None:
    path = write_leftover(await leg_one(demo_tokenizer), tmp_path / "left.parquet")

    def bump(info: dict[str, Any]) -> dict[str, Any]:
        return {**info, "leftover_format_version": 7}

    newer = rewrite_states(path, tmp_path / "newer.parquet", lambda s: None, meta=bump)
    with pytest.raises(UserError) as error:
        read_leftover(newer)
    message = str(error.value)
    assert "newer.parquet" in message and "version 7" in message and "\n" not in message

    def newer_point(state: dict[str, Any]) -> None:
        if state["resume_point"] is not None:
            state["resume_point"]["resume_format_version"] = 9

    point = rewrite_states(path, tmp_path / "point.parquet", newer_point)
    with pytest.raises(UserError, match=r"point\.parquet row 0: resume point version 9"):
        read_leftover(point)


async def test_format_1_files_still_load_and_resume(demo_tokenizer: Any) -> None:
    loaded, info = read_leftover(FORMAT1)
    assert info == {"n": 1, "note": "format 1 fixture"}
    aborted, finished = loaded
    assert aborted.status is TrajectoryStatus.ABORTED and aborted.resume_point is not None
    assert finished.status is TrajectoryStatus.COMPLETED and finished.resume_point is None
    # The same trajectories today's loop makes from the same script (call ids aside).
    today = await leg_one(demo_tokenizer)
    for old, new in zip(loaded, today, strict=True):
        assert (old.spans, old.num_turns, old.tool_errors) == (
            new.spans,
            new.num_turns,
            new.tool_errors,
        )
        assert [m["content"] for m in old.messages] == [m["content"] for m in new.messages]
    resumed, requests = await leg_two(demo_tokenizer, loaded)
    [request] = requests
    assert list(request.input_ids) == list(aborted.prompt_ids) + aborted.response_ids
    assert resumed[0].status is TrajectoryStatus.COMPLETED and resumed[0].metrics["resumes"] == 1
    assert resumed[0].rollout_logprobs[: len(aborted.response_ids)] == aborted.rollout_logprobs
    assert resumed[1] is finished


def test_format_1_admits_no_other_toolrollout_class(tmp_path: Path) -> None:
    table = pq.read_table(FORMAT1)
    column = table.schema.get_field_index("state")
    bad = pickle.dumps(RolloutRunner)  # a toolrollout class, but not a record
    table = table.set_column(column, "state", pa.array([bad] * table.num_rows, pa.binary()))
    pq.write_table(table, tmp_path / "bad.parquet")
    with pytest.raises(UserError, match=r"_runner\.RolloutRunner is not allowed"):
        read_leftover(tmp_path / "bad.parquet")


async def test_a_state_json_cannot_hold_is_not_resumable_and_says_so(
    demo_tokenizer: Any, tmp_path: Path
) -> None:
    def remember(expression: str, context: ToolContext) -> str:
        """Evaluate and remember."""
        context.state["seen"] = object()  # no JSON form
        return "5"

    call = ids(demo_tokenizer, CALL.replace("calculator", "remember") + "<|im_end|>")
    part = ids(demo_tokenizer, "The")
    engine = ScriptedEngine(
        [
            ScriptedOutput(call, logprobs=[-0.5] * len(call)),
            ScriptedOutput(
                part,
                logprobs=[-0.5] * len(part),
                finish_reason=FinishReason(type="abort", message="Aborted"),
            ),
        ]
    )
    rollout = RolloutRunner(engine, demo_tokenizer, [function_tool(remember)])
    [traj] = await rollout.run([PROMPT])
    assert traj.status is TrajectoryStatus.ABORTED and traj.num_tool_calls == 1
    assert traj.resume_point is None
    assert traj.error is not None and "not resumable" in traj.error and "object" in traj.error
    with pytest.raises(UserError, match="no resume point"):
        write_leftover([traj], tmp_path / "left.parquet")
