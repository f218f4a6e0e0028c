"""Leftover files: the trajectories a batch run cut short, kept across processes.

Parquet with the output columns plus ``state``, a versioned JSON object per row that alone
rebuilds the trajectory exactly (docs/rollouts.md describes the format). A field renamed
later is read under its old name too (:data:`_RENAMED`). Format 1 files (a pickled
Trajectory in ``state``) are unpickled by an allow-list and converted on the spot.
"""

from __future__ import annotations

import builtins
import io
import json
import pickle
import time
from array import array
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any, Final, cast

import pyarrow as pa
import pyarrow.parquet as pq

import toolrollout._exceptions as _exceptions
from toolrollout._exceptions import ToolRolloutError, UserError
from toolrollout._records import (
    ResumeFormatError,
    ResumePoint,
    RolloutPrompt,
    TokenSpan,
    Trajectory,
    TrajectoryImage,
    TrajectoryStatus,
)
from toolrollout._records._resume import from_json_value, to_json_value
from toolrollout.tools import ToolResult

from ._drift import DriftLedger
from ._environment import EnvironmentLedger
from ._output import TRAJECTORY_SCHEMA, write_atomic
from ._state import TrajectoryState
from ._types import Counters, Timing, ToolLedger, Transcript
from ._vision_turn import ImageLedger

__all__ = ["LEFTOVER_FORMAT_VERSION", "LEFTOVER_SCHEMA", "read_leftover", "write_leftover"]

LEFTOVER_FORMAT_VERSION: Final = 2
"""The layout written here; 1 was the pickled layout (still read)."""

_LEFTOVER_KEY = b"toolrollout.leftover"

LEFTOVER_SCHEMA = TRAJECTORY_SCHEMA.append(pa.field("state", pa.binary(), nullable=False))
"""The output columns plus ``state``, the row as versioned JSON (resume point too)."""

_RENAMED: Mapping[str, str] = {}
"""Old trajectory key -> current field name. When a :class:`Trajectory` field is renamed,
add the old name here so files written before still load."""

_FIELDS = {f.name: f for f in fields(Trajectory) if f.name != "resume_point"}


def write_leftover(
    trajectories: Iterable[Trajectory], path: str | Path, *, info: Mapping[str, Any] | None = None
) -> Path:
    """Save a batch's leftover (see :class:`~toolrollout.RolloutBatch`) losslessly.

    ``info`` (JSON values) goes into the file's metadata, for the reader to check that the
    run continuing the trajectories uses the same model, tools and ``n``. Parquet only;
    the file appears atomically.
    """
    path = Path(path)
    if path.suffix != ".parquet":
        raise UserError(f"a leftover file is parquet: {path} must end in .parquet")
    rows = []
    for trajectory in trajectories:
        point = trajectory.resume_point
        if trajectory.status is TrajectoryStatus.ABORTED and point is None:
            raise UserError(f"trajectory {trajectory.uid} is aborted but has no resume point")
        state = {
            "leftover_format_version": LEFTOVER_FORMAT_VERSION,
            "trajectory": _trajectory_json(trajectory),
            "resume_point": None if point is None else json.loads(point.to_json()),
        }
        try:
            blob = json.dumps(state, ensure_ascii=False).encode()
        except TypeError as exc:
            raise UserError(f"trajectory {trajectory.uid} cannot be saved: {exc}") from None
        rows.append({**trajectory.to_row(), "state": blob})
    meta = {"leftover_format_version": LEFTOVER_FORMAT_VERSION, **dict(info or {})}
    schema = LEFTOVER_SCHEMA.with_metadata({_LEFTOVER_KEY: json.dumps(meta).encode()})
    table = pa.Table.from_pylist(rows, schema=schema)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(table, path)
    return path


def read_leftover(path: str | Path) -> tuple[list[Trajectory], dict[str, Any]]:
    """The trajectories of a leftover file, equal to those written, and its ``info``.

    Aborted ones carry their resume point again, ready for
    :meth:`~toolrollout.rollout.RolloutRunner.resume`. A missing file, one that is not a
    leftover file, or one of a version this toolrollout does not read is a one-line
    :class:`UserError`.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"leftover file not found: {path}")
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise UserError(f"{path} is not a leftover file (unreadable as parquet: {exc})") from None
    raw = (table.schema.metadata or {}).get(_LEFTOVER_KEY)
    if raw is None or "state" not in table.column_names:
        raise UserError(
            f"{path} is not a leftover file (written by write_leftover, or by a run with "
            "{target_groups})",
            "target_groups",
        )
    info = json.loads(raw)
    version = info.pop("leftover_format_version", info.pop("format", None))
    if version not in (1, LEFTOVER_FORMAT_VERSION):
        raise UserError(
            f"{path} is a leftover file of format version {version!r}; this toolrollout "
            f"reads versions 1 and {LEFTOVER_FORMAT_VERSION}"
        )
    trajectories = []
    for index, blob in enumerate(table.column("state").to_pylist()):
        try:
            trajectories.append(_read_row(blob))
        except (UserError, ResumeFormatError) as exc:
            raise UserError(f"{path} row {index}: {exc}") from None
        except Exception as exc:  # any decoding failure means the same: a bad file
            raise UserError(f"{path} row {index}: unreadable trajectory state ({exc})") from None
    return trajectories, info


def _read_row(blob: bytes) -> Trajectory:
    if blob[:1] == b"\x80":  # a pickle: format 1
        return _from_format1(blob)
    state = json.loads(blob)
    version = state.get("leftover_format_version")
    if version != LEFTOVER_FORMAT_VERSION:
        raise UserError(f"trajectory state of format version {version!r}")
    point = state.get("resume_point")
    resume = None if point is None else ResumePoint.from_json(json.dumps(point))
    return _trajectory_of(state["trajectory"], resume)


_CODECS: Mapping[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {
    "status": (str, TrajectoryStatus),
    "spans": (
        lambda s: [s.kind, list(s.ids), list(s.logprobs)],
        lambda s: TokenSpan(s[0], tuple(s[1]), tuple(float(x) for x in s[2])),
    ),
    "images": (
        lambda i: {"png": to_json_value(i.png), "start": i.start, "end": i.end,
                   "grid_thw": list(i.grid_thw)},
        lambda i: TrajectoryImage(from_json_value(i["png"]), i["start"], i["end"],
                                  tuple(i["grid_thw"])),
    ),
}  # fmt: skip
"""How a field (each item of a tuple field) is written as JSON and read back; the others
use the tagged codec of ``_records``."""

_TUPLES = frozenset({"prompt_ids", "spans", "messages", "turn_rewards", "tool_rewards", "images"})


def _trajectory_json(trajectory: Trajectory) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in _FIELDS:
        write, value = _CODECS.get(name, (to_json_value,))[0], getattr(trajectory, name)
        out[name] = [write(item) for item in value] if name in _TUPLES else write(value)
    return out


def _trajectory_of(data: Mapping[str, Any], resume: ResumePoint | None) -> Trajectory:
    values: dict[str, Any] = {}
    for key, value in data.items():
        name = _RENAMED.get(key, key)
        if name in _FIELDS:  # unknown keys (a newer writer's extras) are ignored
            values[name] = value
    missing = [
        name
        for name, f in _FIELDS.items()
        if name not in values and f.default is MISSING and f.default_factory is MISSING
    ]
    if missing:
        raise UserError(f"the trajectory has no {', '.join(missing)}")
    for name, value in list(values.items()):
        read = _CODECS.get(name, (None, from_json_value))[1]
        values[name] = tuple(map(read, value)) if name in _TUPLES else read(value)
    return Trajectory(**values, resume_point=resume)


# --- format 1: pickled trajectories -------------------------------------------------------

_SAFE_BUILTINS = frozenset(
    {"bytearray", "bytes", "complex", "dict", "float", "frozenset", "int", "list", "object"}
    | {"set", "slice", "str", "tuple", "bool", "range"}
)
_SAFE_GLOBALS = frozenset(
    {
        ("copyreg", "_reconstructor"),
        ("collections", "OrderedDict"),
        ("collections", "defaultdict"),
        ("collections", "deque"),
        ("datetime", "date"),
        ("datetime", "datetime"),
        ("datetime", "timedelta"),
        ("decimal", "Decimal"),
        ("numpy", "dtype"),
        ("numpy", "ndarray"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "scalar"),
        ("PIL.Image", "Image"),
        ("PIL.Image", "_conv_type_shape"),
    }
)


class _Format1State:
    """Stands in for format 1's loop state (``rollout._loop._State``): its fields only."""

    def __getattr__(self, name: str) -> Any:  # a field that file did not have
        raise AttributeError(name)


class _Format1Point:
    """Stands in for format 1's ``rollout._loop.ResumePoint(prompt, _state, _env)``."""

    prompt: RolloutPrompt
    state: _Format1State
    env: dict[str, Any]

    def __setstate__(self, state: Any) -> None:
        self.prompt, self.state, self.env = state


_RECORDS: Mapping[tuple[str, str], type] = {
    ("toolrollout.rollout._loop", "_State"): _Format1State,
    ("toolrollout.rollout._loop", "ResumePoint"): _Format1Point,
    ("toolrollout.rollout._loop", "RolloutPrompt"): RolloutPrompt,
    ("toolrollout.rollout._trajectory", "Trajectory"): Trajectory,
    ("toolrollout.rollout._trajectory", "TokenSpan"): TokenSpan,
    ("toolrollout.rollout._trajectory", "TrajectoryStatus"): TrajectoryStatus,
    ("toolrollout.rollout._images", "TrajectoryImage"): TrajectoryImage,
    ("toolrollout.rollout._vision_turn", "ImageLedger"): ImageLedger,
    ("toolrollout.tools._types", "ToolResult"): ToolResult,
}
"""The only toolrollout classes a format-1 file may name, by where format 1 kept them."""


class _Format1Unpickler(pickle.Unpickler):
    """Builds plain values, the record classes above and toolrollout's tool errors only."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "builtins" and name in _SAFE_BUILTINS:
            return getattr(builtins, name)
        if (module, name) in _SAFE_GLOBALS:
            return super().find_class(module, name)
        record = _RECORDS.get((module, name))
        if record is not None:
            return record
        if module == "toolrollout._exceptions":  # the error of a recorded tool result
            error = getattr(_exceptions, name, None)
            if isinstance(error, type) and issubclass(error, ToolRolloutError):
                return error
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a leftover file")


def _from_format1(blob: bytes) -> Trajectory:
    trajectory = _Format1Unpickler(io.BytesIO(blob)).load()
    if not isinstance(trajectory, Trajectory):
        raise UserError("the state is not a trajectory")
    point: Any = trajectory.resume_point
    if point is None:
        return _replace_resume(trajectory, None)
    if not isinstance(point, _Format1Point):
        raise UserError("the resume point is not one of format 1")
    spent = float(trajectory.metrics.get("total_seconds", 0.0))
    resume = _format1_state(point, spent).to_resume_point(list(point.state.model_texts))
    return _replace_resume(trajectory, resume)


def _replace_resume(trajectory: Trajectory, resume: ResumePoint | None) -> Trajectory:
    # A format-1 record lacks the fields added since (their defaults then apply).
    values = {name: getattr(trajectory, name) for name in _FIELDS if hasattr(trajectory, name)}
    return Trajectory(**values, resume_point=resume)


def _format1_state(point: _Format1Point, spent: float) -> TrajectoryState:
    """Format 1's loop state, field by field, as today's state (to save as a resume point)."""
    old, env = point.state, point.env
    state = TrajectoryState(
        cast(Any, None),  # never run: only turned into a resume point
        point.prompt,
        prompt_index=old.prompt_index,
        sample_index=old.sample_index,
        group_id=old.group_id,
        uid=old.uid,
    )
    state.transcript = Transcript(
        messages=list(old.messages),
        prompt_ids=array("i", old.prompt_ids),
        spans=list(old.spans),
        open_turn=old.open_turn,
        segments=list(old.segments),
    )
    state.counters = Counters(  # a counter added since format 1 starts at its default
        **{name: getattr(old, name) for name in Counters.__dataclass_fields__ if hasattr(old, name)}
    )
    state.timing = Timing(
        prior_seconds=spent,
        started=time.perf_counter(),
        generation_seconds=old.generation_seconds,
        tool_seconds=old.tool_seconds,
        tool_latency=dict(old.tool_latency),
    )
    state.tools = ToolLedger(
        state=dict(old.tool_state),
        records=[(n, r.seconds, r.attempts, r.is_error, r.error_kind) for n, r in old.tool_records],
    )
    state.drift = DriftLedger(
        checkpoints=list(old.drift_checkpoints),
        checked=set(old.drift_checked),
        found=dict(old.drift_found),
    )
    state.vision = old.vision
    state.environment = EnvironmentLedger(**{k: env[k] for k in _FORMAT1_ENV if k in env})
    return state


_FORMAT1_ENV = (
    *("turn_rewards", "tool_rewards", "interaction_turns", "appended_turns"),
    *("interaction_tokens", "interaction_metrics", "errors"),
)
"""The keys of format 1's environment dict, each a field of :class:`EnvironmentLedger`."""
