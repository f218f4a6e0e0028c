"""Leftover files: a ``--target-groups`` run saves what it cut short, a later run resumes it.

Against the real embedded server (the ``toolrollout serve`` app, demo model) decoding one
sequence at a time, so a batch target is met while other trajectories are queued or
mid-generation and their aborts reach the server. The leftover is written to disk and read
back in another CLI invocation, the way a user runs it; the resumed trajectories must go on
from exactly the saved tokens (same ids, masks and logprobs), not start over.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tests._serve_thread import demo_server_in_thread
from typer.testing import CliRunner

from toolrollout._exceptions import UserError
from toolrollout.apps.cli import app
from toolrollout.apps.demo import DEMO_MODEL_PATH, load_demo_prompts
from toolrollout.engines import SamplingParams, SGLangClient
from toolrollout.rollout import (
    RolloutConfig,
    RolloutRunner,
    Trajectory,
    TrajectoryStatus,
    read_leftover,
    read_rows,
    write_leftover,
    write_trajectories,
)
from toolrollout.tools import calculator_tool

RUN = ["--n", "2", "--max-new-tokens", "64", "--max-turns", "3", "--seed", "11"]


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """The app of `toolrollout serve` under uvicorn in a thread, one sequence at a time."""
    with demo_server_in_thread() as url:
        yield url


def generate(*args: str) -> Any:
    return CliRunner().invoke(app, ["generate", *args], env={"COLUMNS": "160"})


@pytest.fixture(scope="module")
def first_run(server: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A batch of 1 group out of 3 launched; its output and leftover live in this folder."""
    folder = tmp_path_factory.mktemp("leftover")
    out = folder / "batch.jsonl"
    result = generate(
        "--engine-url", server, *RUN, "--target-groups", "1", "--oversample", "3",
        "--out", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return folder


def _state_without_clock(trajectory: Trajectory) -> Any:
    assert trajectory.resume_point is not None
    # The JSON resume point holds no process-local clock (only the seconds spent so far).
    return trajectory.resume_point.state


def test_leftover_file_round_trips_trajectories_exactly(server: str, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(DEMO_MODEL_PATH))
    config = RolloutConfig(
        # Every turn runs to its cap, so the target is met with a turn mid-generation.
        sampling=SamplingParams(max_new_tokens=48, temperature=1.0, ignore_eos=True),
        n=2,
        max_turns=1,
        seed=3,
    )

    async def main() -> tuple[Trajectory, ...]:
        async with SGLangClient(server) as client:
            runner = RolloutRunner(client, tokenizer, [calculator_tool()], config=config)
            batch = await runner.run_batch(load_demo_prompts()[:3], target_groups=1)
            return batch.leftover

    leftover = anyio.run(main)
    assert any(t.status is TrajectoryStatus.ABORTED for t in leftover)
    path = write_leftover(leftover, tmp_path / "left.parquet", info={"n": 2, "note": "x"})
    loaded, info = read_leftover(path)
    assert info == {"n": 2, "note": "x"}
    assert loaded == list(leftover)  # every field: ids, spans, float64 logprobs, messages...
    for before, after in zip(leftover, loaded, strict=True):
        assert after.spans == before.spans and after.messages == before.messages
        assert (after.resume_point is None) == (before.resume_point is None)
        if before.resume_point is not None:
            assert after.resume_point is not None
            assert after.resume_point.prompt == before.resume_point.prompt
            # The loop's own state too (open turn, raw text, checkpoints); only the
            # process-local clock is rebased.
            assert _state_without_clock(after) == _state_without_clock(before)
    # An ordinary output file is not a leftover file, and saying so is one clear error.
    plain = write_trajectories(list(leftover), tmp_path / "plain.parquet")
    with pytest.raises(UserError, match="is not a leftover file"):
        read_leftover(plain)
    with pytest.raises(UserError, match="not found"):
        read_leftover(tmp_path / "missing.parquet")
    # The state column is unpickled with an allow-list: a pickle that would call a
    # function (here os.system) is refused before anything runs.
    table = pq.read_table(path)
    evil = pickle.dumps(_Evil(tmp_path / "pwned"))
    column = table.schema.get_field_index("state")
    table = table.set_column(column, "state", pa.array([evil] * table.num_rows, pa.binary()))
    pq.write_table(table, tmp_path / "evil.parquet")
    with pytest.raises(UserError, match=r"(posix|os)\.system is not allowed"):
        read_leftover(tmp_path / "evil.parquet")
    assert not (tmp_path / "pwned").exists()


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        import os

        return (os.system, (f"touch {self.marker}",))


def test_target_groups_run_saves_its_leftover(first_run: Path) -> None:
    rows = read_rows(first_run / "batch.jsonl")
    assert len(rows) == 2 and len({r["group_id"] for r in rows}) == 1
    leftover, info = read_leftover(first_run / "batch.leftover.parquet")
    assert info["n"] == 2 and info["tools"] == ["calculator"]
    assert len(leftover) == 4  # the two other groups, whole
    assert {t.uid for t in leftover}.isdisjoint(r["uid"] for r in rows)
    assert {(t.prompt_index, t.sample_index) for t in leftover} | {
        (r["prompt_index"], r["sample_index"]) for r in rows
    } == {(p, s) for p in range(3) for s in range(2)}
    aborted = [t for t in leftover if t.status is TrajectoryStatus.ABORTED]
    assert aborted and all(t.resume_point is not None for t in aborted)


def test_resume_leftover_continues_from_the_saved_tokens(server: str, first_run: Path) -> None:
    saved, _ = read_leftover(first_run / "batch.leftover.parquet")
    out = first_run / "resumed.jsonl"
    result = generate(
        "--engine-url", server, "--max-new-tokens", "24", "--max-turns", "2",
        "--resume-leftover", str(first_run / "batch.leftover.parquet"), "--out", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = {r["uid"]: r for r in read_rows(out)}  # JSONL keeps the float64 logprobs
    assert sorted(rows) == sorted(t.uid for t in saved)
    assert all(r["status"] != "aborted" for r in rows.values())
    with_tokens = 0
    for t in saved:
        row = rows[t.uid]
        if t.status is not TrajectoryStatus.ABORTED:
            assert row["response_ids"] == t.response_ids  # a finished sibling, unchanged
            continue
        head = len(t.response_ids)
        with_tokens += head > 0
        assert row["prompt_ids"] == list(t.prompt_ids)
        assert row["response_ids"][:head] == t.response_ids
        assert row["loss_mask"][:head] == t.loss_mask
        assert row["rollout_logprobs"][:head] == t.rollout_logprobs
        assert len(row["response_ids"]) > head
        assert row["metrics"]["resumes"] == 1
    assert with_tokens > 0, "no aborted trajectory had partial tokens to continue"
    # Everything finished, so the new leftover is empty.
    again, _ = read_leftover(first_run / "resumed.leftover.parquet")
    assert again == []


def test_resume_leftover_with_a_target_is_a_batch_again(server: str, first_run: Path) -> None:
    """--resume-leftover --target-groups 1 on two groups: one is written, the other is
    saved again (still resumable, its saved tokens kept) under the new --out's name."""
    saved = {t.uid: t for t in read_leftover(first_run / "batch.leftover.parquet")[0]}
    out = first_run / "step2.jsonl"
    result = generate(
        "--engine-url", server, "--max-new-tokens", "64", "--max-turns", "3",
        "--resume-leftover", str(first_run / "batch.leftover.parquet"),
        "--target-groups", "1", "--out", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = read_rows(out)
    assert len(rows) == 2 and len({r["group_id"] for r in rows}) == 1
    again, _ = read_leftover(first_run / "step2.leftover.parquet")
    assert len(again) == 2 and {t.group_id for t in again}.isdisjoint(r["group_id"] for r in rows)
    for t in again:
        before = saved[t.uid]
        assert t.response_ids[: len(before.response_ids)] == before.response_ids
        assert t.status is not TrajectoryStatus.ABORTED or t.resume_point is not None


def test_bad_leftover_input_is_one_line_and_exit_2(first_run: Path, tmp_path: Path) -> None:
    leftover = first_run / "batch.leftover.parquet"
    trajectories, info = read_leftover(leftover)
    other_tools = write_leftover(
        trajectories, tmp_path / "t.parquet", info={**info, "tools": ["x"]}
    )
    other_tokenizer = write_leftover(
        trajectories, tmp_path / "k.parquet", info={**info, "tokenizer": "0123456789abcdef"}
    )
    cases = [
        (["--resume-leftover", str(tmp_path / "none.parquet")], "leftover file not found"),
        (["--resume-leftover", str(first_run / "batch.jsonl")], "is not a leftover file"),
        (["--resume-leftover", str(other_tools)], "pass the same --tool-config"),
        (["--resume-leftover", str(leftover), "--n", "3"], "were run with --n 2"),
        (["--resume-leftover", str(leftover), "--limit", "2"], "drop --dataset/--limit"),
        (["--leftover", str(tmp_path / "l.parquet")], "--leftover needs --target-groups"),
        (["--finish-tools"], "--finish-tools needs --target-groups"),
        (["--resume-leftover", str(leftover), "--leftover", "l.jsonl"], "must be a .parquet"),
        (["--resume-leftover", str(other_tokenizer)], "another tokenizer"),
        (["--resume-leftover", str(leftover), "--oversample", "2"], "does not apply"),
        # A continued trajectory's turns must come from one distribution.
        (["--resume-leftover", str(leftover), "--temperature", "0.5"], "(now 0.5)"),
    ]
    for args, message in cases:
        result = generate(*args, "--out", str(tmp_path / "o.jsonl"))
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output, (args, result.output)
        assert len(result.output.strip().splitlines()) == 1, result.output


@pytest.mark.parametrize(("flags", "expected"), [([], "cancel"), (["--finish-tools"], "finish")])
def test_finish_tools_sets_what_tool_calls_do_at_the_target(
    flags: list[str], expected: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import toolrollout.spec as spec_module

    seen: list[Any] = []

    def capture(spec: Any, **_: Any) -> Any:
        seen.append(spec)
        raise UserError("stopped after the run spec was built")

    monkeypatch.setattr(spec_module, "load_components", capture)
    result = generate("--target-groups", "1", *flags, "--out", str(tmp_path / "o.jsonl"))
    assert "stopped after the run spec was built" in result.output, result.output
    [spec] = seen
    assert spec.config.tools_at_target == expected
