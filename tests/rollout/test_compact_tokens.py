"""Token spans in compact arrays: what goes in comes out exactly, at a fraction of the bytes.

The logprobs an engine reports must reach the trainer exactly (its importance ratios and
the teacher-forced agreement checks compare them with recomputed ones). SGLang computes
them in float32 and writes them as JSON floats, so a span keeps them in 4 bytes when that
is exact and in 8 otherwise; these tests feed both kinds of values.
"""

from __future__ import annotations

import gc
import json
import pickle
import random
import sys
from array import array
from typing import Any

import pytest

from toolrollout import RolloutRunner
from toolrollout._records import TokenSpan, Trajectory, TrajectoryStatus
from toolrollout.engines import TokenRuns
from toolrollout.engines._wire import generate_body
from toolrollout.rollout import TrajectoryHooks, TrajectoryState
from toolrollout.rollout._types import ModelTurn, Transcript, id_tuple
from toolrollout.testing import ScriptedEngine
from toolrollout.tools import calculator_tool
from toolrollout.tools._summary import summarize_call_records


def _float32_values(n: int, seed: int = 0) -> list[float]:
    """Values as SGLang writes them: float32 logprobs, printed and parsed as JSON floats."""
    rng = random.Random(seed)
    values = array("f", [-rng.expovariate(3.0) for _ in range(n)]).tolist()
    parsed: list[float] = json.loads(json.dumps(values))
    return parsed


def test_float32_logprobs_are_kept_in_four_bytes_and_come_back_exactly() -> None:
    logprobs = _float32_values(256)
    ids = [random.Random(1).randrange(151_000) for _ in range(256)]
    span = TokenSpan("model", tuple(ids), tuple(logprobs))
    assert span.logprob_array is not None and span.logprob_array.typecode == "f"
    assert span.ids == tuple(ids)
    assert span.logprobs == tuple(logprobs)  # the very float64 values that were parsed
    assert span.loss_mask == (1,) * 256


def test_values_float32_would_round_keep_eight_bytes() -> None:
    logprobs = [-0.1, -1e-9, -(2.0**-40) * 3, -123.456789012345]
    span = TokenSpan("model", (1, 2, 3, 4), logprobs)
    assert span.logprob_array is not None and span.logprob_array.typecode == "d"
    assert span.logprobs == tuple(logprobs)


def test_environment_spans_store_no_logprobs() -> None:
    span = TokenSpan("tool", [7, 8, 9], None)
    assert span.logprob_array is None
    assert span.logprobs == (0.0, 0.0, 0.0) and span.loss_mask == (0, 0, 0)
    assert TokenSpan("interaction", [7, 8, 9], [0.0] * 3) == TokenSpan(
        "interaction", [7, 8, 9], None
    )
    with pytest.raises(ValueError, match="logprobs"):
        TokenSpan("model", [1], None)
    with pytest.raises(ValueError, match="2 ids but 1 logprobs"):
        TokenSpan("model", [1, 2], [-0.5])


def test_spans_pickle_and_hash_like_values() -> None:
    span = TokenSpan("model", (3, 4), _float32_values(2))
    again = pickle.loads(pickle.dumps(span))
    assert again == span and hash(again) == hash(span)
    # Spans pickled before the arrays held (kind, ids tuple, logprobs tuple).
    old = TokenSpan.__new__(TokenSpan)
    old.__setstate__(("tool", (5, 6), (0.0, 0.0)))
    assert old == TokenSpan("tool", (5, 6), None)


def test_trajectory_columns_are_the_span_values_in_order() -> None:
    model = [*_float32_values(5), -0.1]
    spans = (
        TokenSpan("model", range(10, 16), model),
        TokenSpan("tool", [1, 2], None),
        TokenSpan("model", [20], [-0.25]),
    )
    trajectory = Trajectory(
        uid="g-0", group_id="g", prompt_index=0, sample_index=0, prompt_ids=(1, 2, 3),
        spans=spans, messages=(), status=TrajectoryStatus.COMPLETED, finish_reason="stop",
    )  # fmt: skip
    assert trajectory.response_ids == [10, 11, 12, 13, 14, 15, 1, 2, 20]
    assert trajectory.loss_mask == [1] * 6 + [0, 0, 1]
    assert trajectory.rollout_logprobs == [*model, 0.0, 0.0, -0.25]
    row = trajectory.to_row()
    assert row["rollout_logprobs"] == trajectory.rollout_logprobs
    assert all(type(x) is float for x in row["rollout_logprobs"])
    assert all(type(x) is int for x in row["response_ids"])


def test_transcript_ids_and_request_tuples() -> None:
    transcript = Transcript(messages=[], prompt_ids=array("i", [1, 2, 300_000]))
    transcript.spans.append(TokenSpan("model", [400_000, 5], [-0.5, -0.25]))
    transcript.spans.append(TokenSpan("tool", [6], None))
    ids = transcript.ids()
    assert ids.tolist() == [1, 2, 300_000, 400_000, 5, 6] and transcript.response_len == 3
    first, second = id_tuple(ids), id_tuple(ids)
    assert first == (1, 2, 300_000, 400_000, 5, 6)
    assert all(a is b for a, b in zip(first, second, strict=True))  # shared int objects
    assert id_tuple(array("i", [-1, 2])) == (-1, 2) and id_tuple(array("i")) == ()
    # A negative id anywhere (even among large ones) is kept as it is, never a table entry.
    assert id_tuple(array("i", [300_000, 5, -3, 7])) == (300_000, 5, -3, 7)
    assert id_tuple(array("i", [-(2**31), 2**31 - 1])) == (-(2**31), 2**31 - 1)
    assert id_tuple([4, -1]) == (4, -1)  # not an array: the same answer
    assert id_tuple(array("i", [2**31 - 1, 3])) == (2**31 - 1, 3)  # no table of 2**31 ints


def test_compact_spans_take_a_fraction_of_the_tuples_bytes() -> None:
    logprobs = _float32_values(256)
    ids = [100_000 + i for i in range(256)]
    span = TokenSpan("model", ids, logprobs)
    compact = sys.getsizeof(span.id_array) + sys.getsizeof(span.logprob_array)
    as_tuples = (
        sys.getsizeof(tuple(ids))
        + sum(map(sys.getsizeof, ids))
        + sys.getsizeof(tuple(logprobs))
        + sum(map(sys.getsizeof, logprobs))
    )
    assert compact / 256 < 9  # 4 + 4 bytes a token, plus the two array headers
    assert as_tuples / 256 > 60


async def test_a_waiting_request_shares_the_transcripts_arrays(demo_tokenizer: Any) -> None:
    """The request of a later turn holds the prompt's and the spans' own arrays (no copy
    of the conversation while it waits), and sends exactly the transcript's ids."""
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 3"}}\n'
    outputs = [f"{call}</tool_call><|im_end|>", "It is 5.<|im_end|>"]
    engine = ScriptedEngine([demo_tokenizer.encode(t, add_special_tokens=False) for t in outputs])
    runner = RolloutRunner(engine, demo_tokenizer, [calculator_tool()])
    (trajectory,) = await runner.run([{"messages": [{"role": "user", "content": "2 + 3?"}]}])
    assert trajectory.status is TrajectoryStatus.COMPLETED, trajectory.error
    first, second = engine.requests
    assert list(first.input_ids) == list(trajectory.prompt_ids)
    model, tool = trajectory.spans[:2]
    assert second.input_ids == array("i", [*trajectory.prompt_ids, *model.ids, *tool.ids])
    assert isinstance(second.input_ids, TokenRuns)
    prompt_run, *span_runs = second.input_ids.runs
    assert span_runs[0] is model.id_array and span_runs[1] is tool.id_array
    assert isinstance(first.input_ids, TokenRuns) and prompt_run is first.input_ids.runs[0]
    # what the request adds: a few pointers, not 4 bytes a token of a joined copy
    assert sys.getsizeof(second.input_ids) + sys.getsizeof(second.input_ids.runs) < 200
    assert len(second.input_ids) > 40
    # and the wire body is the same list of ids a joined array gives
    assert generate_body(second, "r")["input_ids"] == second.input_ids.joined().tolist()


async def test_each_model_turn_keeps_one_copy_of_its_text(demo_tokenizer: Any) -> None:
    """The state keeps the parsed message, not the raw text too: the raw text (what the
    drift check renders) is decoded again from the span's ids, and it is the same text."""
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 3"}}\n'
    outputs = [f"{call}</tool_call><|im_end|>", "It is 5.<|im_end|>"]
    engine = ScriptedEngine([demo_tokenizer.encode(t, add_special_tokens=False) for t in outputs])
    seen: list[tuple[str, list[str], dict[str, Any], bool]] = []

    class Watch(TrajectoryHooks):
        async def on_model_turn(self, state: TrajectoryState, turn: ModelTurn) -> None:
            message = state.transcript.messages[-1]
            seen.append(
                (turn.text, state.model_texts(), message, hasattr(state.transcript, "model_texts"))
            )

    runner = RolloutRunner(engine, demo_tokenizer, [calculator_tool()], hooks=Watch())
    (trajectory,) = await runner.run([{"messages": [{"role": "user", "content": "2 + 3?"}]}])
    assert trajectory.status is TrajectoryStatus.COMPLETED, trajectory.error
    assert [text for text, *_ in seen] == [t.removesuffix("<|im_end|>") for t in outputs]
    for number, (text, derived, message, kept) in enumerate(seen):
        assert derived[number] == text and len(derived) == number + 1
        assert "raw_content" not in message and not kept
    assert seen[0][2]["tool_calls"][0]["function"]["name"] == "calculator"
    # the drift check rendered the derived texts and found the transcript exact
    assert trajectory.metrics["drift_mismatches"] == 0 and "drift_reports" not in trajectory.metrics


async def test_tool_calls_are_recorded_as_atomic_tuples_the_collector_drops(
    demo_tokenizer: Any,
) -> None:
    """The per-tool summary needs name, seconds, attempts and error kind of each call: a
    tuple of atomic values (which the cyclic collector stops tracking), not the result."""
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 3"}}\n'
    outputs = [f"{call}</tool_call><|im_end|>", "It is 5.<|im_end|>"]
    engine = ScriptedEngine([demo_tokenizer.encode(t, add_special_tokens=False) for t in outputs])
    records: list[Any] = []

    class Watch(TrajectoryHooks):
        async def on_model_turn(self, state: TrajectoryState, turn: ModelTurn) -> None:
            records.extend(state.tools.records)

    runner = RolloutRunner(engine, demo_tokenizer, [calculator_tool()], hooks=Watch())
    (trajectory,) = await runner.run([{"messages": [{"role": "user", "content": "2 + 3?"}]}])
    (record,) = records
    name, seconds, attempts, is_error, kind = record
    assert (name, attempts, is_error, kind) == ("calculator", 1, False, None) and seconds >= 0
    gc.collect()
    assert not gc.is_tracked(record)
    stats = trajectory.metrics["tool_stats"]["calculator"]
    assert stats["calls"] == 1 and stats["errors"] == 0 and stats["seconds"] == round(seconds, 6)


def test_records_of_every_error_kind_are_summarised() -> None:
    """The summary reads each record's error kind, toolrollout's own kinds and others alike."""
    records = [
        ("t", 0.5, 1, True, "CircuitOpen"),
        ("t", 0.25, 2, True, "ToolTimeout"),
        ("t", 0.1, 1, True, "SomethingElse"),
        ("t", 0.2, 1, False, None),
    ]
    (summary,) = summarize_call_records(records).values()
    assert (summary.calls, summary.errors, summary.retries) == (4, 3, 1)
    assert (summary.circuit_open, summary.timeouts) == (1, 1)
    assert dict(summary.error_kinds) == {"CircuitOpen": 1, "ToolTimeout": 1, "SomethingElse": 1}
