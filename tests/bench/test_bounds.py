"""The bounds a run is judged by: FIFO and oracle replays, GRPO group completion times."""

from __future__ import annotations

from typing import Any

import pytest

from toolrollout._exceptions import BenchmarkError
from toolrollout.apps.bench._harness import mode_policies
from toolrollout.apps.bench._metrics import (
    GROUP_DECILES,
    ModeResult,
    group_completion_times,
    measured_ends,
    replay,
    replay_makespan,
)
from toolrollout.apps.bench._model import WorkerFlags, worker_flags

# A: one 2 s generation. B: 1 s, a 3 s tool call, 1 s. One slot; A arrives first.
REQUESTS = [
    {"key": "p0s0", "turn": 0, "slot_seconds": 2.0, "server": 0},
    {"key": "p1s0", "turn": 0, "slot_seconds": 1.0, "server": 0},
    {"key": "p1s0", "turn": 1, "slot_seconds": 1.0, "server": 0},
]
CALLS = [{"key": "p1s0.0", "seconds": 3.0}]


def test_fifo_serves_in_arrival_order_and_the_oracle_serves_the_longest_rest_first() -> None:
    # FIFO: A 0-2, B 2-3, tool to 6, B 6-7. Oracle: B (5 s left) 0-1, A 1-3, B 4-5.
    assert replay(REQUESTS, CALLS, 1) == {"p0s0": 2.0, "p1s0": 7.0}
    assert replay_makespan(REQUESTS, CALLS, 1) == 7.0
    assert replay(REQUESTS, CALLS, 1, order="oracle") == {"p1s0": 5.0, "p0s0": 3.0}
    assert replay_makespan(REQUESTS, CALLS, 1, order="oracle") == 5.0
    # with a slot each nothing queues: both replays are the critical path
    oracle = replay_makespan(REQUESTS, CALLS, 2, order="oracle")
    assert oracle == replay_makespan(REQUESTS, CALLS, 2) == 5.0
    # turns done first: at 0 nobody has a turn done, so arrival order decides (as FIFO)
    assert replay(REQUESTS, CALLS, 1, order="turns") == {"p0s0": 2.0, "p1s0": 7.0}
    with pytest.raises(ValueError, match="order"):
        replay(REQUESTS, CALLS, 1, order="lifo")


def test_turns_order_serves_a_later_turn_before_a_first_one() -> None:
    # A, B, C arrive at 0 (1 s each, one slot); A comes back at 1 for a second turn.
    requests = [
        {"key": "p0s0", "turn": 0, "slot_seconds": 1.0},
        {"key": "p0s0", "turn": 1, "slot_seconds": 1.0},
        {"key": "p1s0", "turn": 0, "slot_seconds": 1.0},
        {"key": "p2s0", "turn": 0, "slot_seconds": 1.0},
    ]
    calls = [{"key": "p0s0.0", "seconds": 0.0}]
    fifo = replay(requests, calls, 1)
    turns = replay(requests, calls, 1, order="turns")
    fewest = replay(requests, calls, 1, order="fewest")
    assert fifo["p0s0"] == 4.0 and turns["p0s0"] == 3.0  # its second turn jumps the queue
    assert fewest == fifo  # a first turn is always waiting ahead of A's second one
    assert max(fifo.values()) == max(turns.values()) == 4.0


def test_length_order_knows_the_turns_left_but_not_the_tool_latencies() -> None:
    # One slot; A, B, C queue at 0 in that order. A: one 1 s turn. B: three 1 s turns,
    # instant tools. C: two 1 s turns around a 10 s tool call.
    requests = [{"key": "p0s0", "turn": 0, "slot_seconds": 1.0}]
    requests += [{"key": "p1s0", "turn": t, "slot_seconds": 1.0} for t in range(3)]
    requests += [{"key": "p2s0", "turn": t, "slot_seconds": 1.0} for t in range(2)]
    calls = [{"key": f"p1s0.{t}", "seconds": 0.0} for t in range(2)]
    calls.append({"key": "p2s0.0", "seconds": 10.0})
    # FIFO serves C's first turn third: its tool ends at 13, C at 14
    assert replay(requests, calls, 1) == {"p0s0": 1.0, "p1s0": 5.0, "p2s0": 14.0}
    # length: B (3 turns to go) first, then C (2) before A (1): C's tool ends at 12
    assert replay(requests, calls, 1, order="length") == {"p0s0": 4.0, "p1s0": 5.0, "p2s0": 13.0}
    # the oracle knows C's tool takes 10 s (12 s of work left): C first, done at 12
    assert replay(requests, calls, 1, order="oracle") == {"p0s0": 3.0, "p1s0": 5.0, "p2s0": 12.0}


def test_oldest_order_serves_the_group_that_arrived_first() -> None:
    # One slot, instant tools, two 1 s turns each. p1's group arrived first on the live
    # server (4.0 against 5.0), though p0s0 comes first in the log.
    requests = [
        {"key": "p0s0", "turn": 0, "slot_seconds": 1.0, "arrived": 5.0},
        {"key": "p0s0", "turn": 1, "slot_seconds": 1.0, "arrived": 7.0},
        {"key": "p1s0", "turn": 0, "slot_seconds": 1.0, "arrived": 4.0},
        {"key": "p1s0", "turn": 1, "slot_seconds": 1.0, "arrived": 6.0},
    ]
    # first come, first served: they alternate, and p0s0 (logged first) ends first
    assert replay(requests, [], 1) == {"p0s0": 3.0, "p1s0": 4.0}
    # oldest: p1s0's second turn goes before p0s0's, which waited longer
    assert replay(requests, [], 1, order="oldest") == {"p1s0": 3.0, "p0s0": 4.0}


def test_group_completion_counts_a_group_done_when_its_last_sample_is() -> None:
    ends = {"p0s0": 1.0, "p0s1": 3.0, "p1s0": 2.0, "p1s1": 2.0, "p2s0": 9.0}
    assert group_completion_times(ends) == {"50": 3.0, "90": 9.0, "100": 9.0}
    assert group_completion_times({}) == {"50": 0.0, "90": 0.0, "100": 0.0}


def test_group_deciles_count_each_tenth_of_the_groups_exactly() -> None:
    """Ten groups whose last samples finish at 1..10 s: k tenths are complete at k s."""
    ends = {f"p{g}s{s}": float(g + 1) - 0.1 * s for g in range(10) for s in range(2)}
    times = group_completion_times(ends, GROUP_DECILES)
    assert times == {str(10 * k): float(k) for k in range(1, 11)}


def test_measured_ends_start_at_the_first_arrival() -> None:
    log: list[dict[str, Any]] = [
        {"key": "p0s0", "arrived": 10.0, "ended": 11.0},
        {"key": "p0s0", "arrived": 12.0, "ended": 14.5},
        {"key": "p1s0", "arrived": 10.5, "ended": 12.0},
        {"key": None, "arrived": 0.0, "ended": 1.0},  # not a benchmark trajectory
    ]
    assert measured_ends(log) == {"p0s0": 4.5, "p1s0": 2.0}


def test_mode_results_keep_the_new_bounds_through_json() -> None:
    result = ModeResult(
        "toolrollout:priority", 4, 4, 8, 100, 10.0, 8.0, 1.0, 100.0,
        fifo_makespan_s=9.5, oracle_makespan_s=8.5, groups_s={"50": 5.0, "90": 9.0, "100": 10.0},
    )  # fmt: skip
    data = result.to_dict()
    assert data["oracle_efficiency"] == pytest.approx(0.85)
    assert ModeResult.from_dict(data) == result


def test_modes_name_their_policies() -> None:
    assert mode_policies("toolrollout") == ()
    assert mode_policies("toolrollout:priority+affinity") == ("priority", "affinity")
    with pytest.raises(BenchmarkError):
        mode_policies("toolrollout:fastest")
    with pytest.raises(BenchmarkError):
        mode_policies("lockstep:priority")


def test_a_mode_can_set_its_workers_pacing_and_collector() -> None:
    """``unpaced``, ``finishtools`` and ``gcN`` are the worker's settings, not scheduling
    policies."""
    names = mode_policies("toolrollout:lag+unpaced+gc20000")
    assert names == ("lag", "unpaced", "gc20000")
    assert worker_flags(names) == WorkerFlags(("lag",), paced=False, gc_threshold=20000)
    assert worker_flags(mode_policies("toolrollout:oldest")) == WorkerFlags(("oldest",))
    assert worker_flags(mode_policies("oversample:oldest+finishtools")) == WorkerFlags(
        ("oldest",), finish_tools=True
    )
    for bad in ("toolrollout:gc", "toolrollout:gc0", "toolrollout:gc1e4"):
        with pytest.raises(BenchmarkError):
            mode_policies(bad)
