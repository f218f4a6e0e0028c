"""The resume payload: every section round-trips, and format 1 as written before still reads.

:data:`SAVED` is a payload written by the hand-written codec that preceded the pydantic
schema (toolrollout at 3c3d04f), from the state :func:`filled_state` builds: the format is
published (leftover files hold it), so it must keep reading, and writing that state again
must give the same JSON.
"""

from __future__ import annotations

import json
from array import array
from typing import Any, cast

import pytest

from toolrollout._exceptions import ToolRolloutError
from toolrollout._records import (
    ResumeFormatError,
    ResumePoint,
    TokenSpan,
    TrajectoryImage,
    TrajectoryStatus,
)
from toolrollout.rollout._resume_payload import resume_prompt
from toolrollout.rollout._state import TrajectoryState
from toolrollout.rollout._types import RolloutPrompt

NO_SERVICES = cast(Any, None)  # the codec never reads the services


def filled_state() -> TrajectoryState:
    """A state with a value in every section, including the ones JSON alone would change."""
    prompt = RolloutPrompt(
        messages=({"role": "user", "content": "hi"},),
        ground_truth=("a", b"\x00b"),
        metadata={"data_source": "x", "ids": {1, 2}},
    )
    state = TrajectoryState(NO_SERVICES, prompt, prompt_index=3, sample_index=1, group_id="g")
    t = state.transcript
    t.prompt_ids = array("i", [1, 2, 3])
    t.spans = [
        TokenSpan("model", [4, 5], [-0.1, -1e-300]),
        TokenSpan("tool", [6], None),
        TokenSpan("model", [7], [-0.5]),
    ]
    t.messages.append({"role": "assistant", "content": "x", "tool_calls": []})
    t.open_turn = True
    t.segments = [(0, 2, "v1"), (3, 4, None)]
    t.forced = (1,)
    state.counters.num_turns = 2
    state.counters.weight_version = "v1"
    state.timing.generation_seconds = 0.25
    state.timing.tool_latency = {"calc": [0.5, 0.125]}
    state.tools.state = cast(dict[str, Any], {"seen": (1, 2), 7: "int key"})
    state.tools.records = [("calc", 0.5, 2, True, "timeout"), ("calc", 0.125, 1, False, None)]
    state.drift.checkpoints = [(4, 3, 1), (6, 4, 2)]
    state.drift.checked = {1, 0}
    state.drift.found = {1: {"kind": "rewrite", "at": (3, 4)}}
    state.vision.images = [TrajectoryImage(b"\x89PNG", 2, 3, (1, 2, 2))]
    state.vision.urls = ["data:image/png;base64,AA=="]
    state.vision.dropped = 1
    env = state.environment
    env.turn_rewards = {2: 0.5, 1: -1.0}
    env.tool_rewards = {1: 0.25}
    env.interaction_turns = 1
    env.interaction_metrics = [{"score": 1.0}]
    env.errors = ["judge timed out"]
    return state


SAVED = """\
{
 "identity": {
  "uid": "g-1",
  "group_id": "g",
  "prompt_index": 3,
  "sample_index": 1
 },
 "prompt": {
  "messages": [
   {
    "role": "user",
    "content": "hi"
   }
  ],
  "ground_truth": {
   "__tr__": "tuple",
   "v": [
    "a",
    {
     "__tr__": "bytes",
     "v": "AGI="
    }
   ]
  },
  "metadata": {
   "data_source": "x",
   "ids": {
    "__tr__": "set",
    "v": [
     1,
     2
    ]
   }
  }
 },
 "transcript": {
  "messages": [
   {
    "role": "user",
    "content": "hi"
   },
   {
    "role": "assistant",
    "content": "x",
    "tool_calls": []
   }
  ],
  "prompt_ids": [
   1,
   2,
   3
  ],
  "spans": [
   [
    "model",
    [
     4,
     5
    ],
    [
     -0.1,
     -1e-300
    ]
   ],
   [
    "tool",
    [
     6
    ],
    [
     0.0
    ]
   ],
   [
    "model",
    [
     7
    ],
    [
     -0.5
    ]
   ]
  ],
  "model_texts": [
   "x"
  ],
  "open_turn": true,
  "segments": [
   [
    0,
    2,
    "v1"
   ],
   [
    3,
    4,
    null
   ]
  ],
  "forced": [
   1
  ]
 },
 "counters": {
  "num_turns": 2,
  "num_tool_calls": 0,
  "tool_errors": 0,
  "parse_errors": 0,
  "resumes": 0,
  "model_tokens": 0,
  "tool_tokens": 0,
  "cached_tokens": 0,
  "tool_calls_cancelled": 0,
  "weight_version": "v1"
 },
 "timing": {
  "spent_seconds": 1.5,
  "generation_seconds": 0.25,
  "tool_seconds": 0.0,
  "tool_latency": {
   "calc": [
    0.5,
    0.125
   ]
  }
 },
 "tools": {
  "state": {
   "__tr__": "dict",
   "v": [
    [
     "seen",
     {
      "__tr__": "tuple",
      "v": [
       1,
       2
      ]
     }
    ],
    [
     7,
     "int key"
    ]
   ]
  },
  "records": [
   {
    "name": "calc",
    "seconds": 0.5,
    "attempts": 2,
    "is_error": true,
    "error_kind": "timeout"
   },
   {
    "name": "calc",
    "seconds": 0.125,
    "attempts": 1,
    "is_error": false,
    "error_kind": null
   }
  ]
 },
 "drift": {
  "checkpoints": [
   [
    4,
    3,
    1
   ],
   [
    6,
    4,
    2
   ]
  ],
  "checked": [
   0,
   1
  ],
  "found": [
   [
    1,
    {
     "kind": "rewrite",
     "at": {
      "__tr__": "tuple",
      "v": [
       3,
       4
      ]
     }
    }
   ]
  ]
 },
 "vision": {
  "images": [
   {
    "png": {
     "__tr__": "bytes",
     "v": "iVBORw=="
    },
    "start": 2,
    "end": 3,
    "grid_thw": [
     1,
     2,
     2
    ]
   }
  ],
  "urls": [
   "data:image/png;base64,AA=="
  ],
  "dropped": 1
 },
 "environment": {
  "turn_rewards": [
   [
    1,
    -1.0
   ],
   [
    2,
    0.5
   ]
  ],
  "tool_rewards": [
   [
    1,
    0.25
   ]
  ],
  "interaction_turns": 1,
  "appended_turns": 0,
  "interaction_tokens": 0,
  "interaction_metrics": [
   {
    "score": 1.0
   }
  ],
  "errors": [
   "judge timed out"
  ]
 }
}
"""


def without_clock(payload: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(payload)
    data["timing"].pop("spent_seconds")
    return data


def assert_same_sections(before: TrajectoryState, after: TrajectoryState) -> None:
    for name in ("transcript", "tools", "drift", "vision", "environment"):
        assert getattr(after, name) == getattr(before, name), name
    assert after.prompt == before.prompt
    assert (after.uid, after.group_id, after.prompt_index, after.sample_index) == (
        before.uid,
        before.group_id,
        before.prompt_index,
        before.sample_index,
    )
    assert after.counters.resumes == before.counters.resumes + 1
    after.counters.resumes -= 1
    assert after.counters == before.counters
    assert after.timing.tool_latency == before.timing.tool_latency
    assert after.timing.generation_seconds == before.timing.generation_seconds
    assert after.status is TrajectoryStatus.RUNNING


def test_every_section_round_trips() -> None:
    state = filled_state()
    point = state.to_resume_point(["x"])
    resumed = TrajectoryState.resumed_from(NO_SERVICES, point)
    assert_same_sections(state, resumed)
    assert isinstance(resumed.transcript.prompt_ids, array)
    assert resumed.transcript.spans[0].logprobs == (-0.1, -1e-300)  # float64, exact
    assert resume_prompt(point) == state.prompt


def test_format_1_as_written_before_reads_and_writes_back() -> None:
    state = filled_state()
    resumed = TrajectoryState.resumed_from(NO_SERVICES, ResumePoint(SAVED, 1))
    assert_same_sections(state, resumed)
    assert without_clock(state.to_resume_point(["x"]).state) == without_clock(SAVED)


def test_missing_keys_take_defaults_and_unknown_keys_are_ignored() -> None:
    data = json.loads(SAVED)
    for section in ("counters", "timing", "tools", "drift", "vision", "environment"):
        del data[section]
    data["added_later"] = {"x": 1}
    data["transcript"]["added_later"] = 1
    resumed = TrajectoryState.resumed_from(NO_SERVICES, ResumePoint(json.dumps(data), 1))
    assert resumed.counters.resumes == 1 and resumed.drift.found == {}
    assert resumed.transcript.open_turn is True


def test_a_broken_payload_is_one_line_naming_the_field() -> None:
    data = json.loads(SAVED)
    del data["identity"]["uid"]
    with pytest.raises(ResumeFormatError, match=r"^not a resume point: identity\.uid: ") as exc:
        TrajectoryState.resumed_from(NO_SERVICES, ResumePoint(json.dumps(data), 1))
    assert "\n" not in str(exc.value)
    with pytest.raises(ResumeFormatError, match="version 2 is newer"):
        TrajectoryState.resumed_from(NO_SERVICES, ResumePoint(SAVED, 2))


def test_a_value_json_cannot_hold_is_refused_when_saving() -> None:
    state = filled_state()
    state.tools.state = {"handle": object()}
    with pytest.raises(ToolRolloutError, match=r"^trajectory g-1 cannot be saved: ") as exc:
        state.to_resume_point([])
    assert "\n" not in str(exc.value)
