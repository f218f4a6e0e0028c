"""Writing trajectories to parquet and JSONL.

Rows are written as trajectories finish (one row group per flush), so a long run keeps
its finished work on disk instead of in memory. pyarrow is used directly with an explicit
schema: pandas, polars and Hugging Face ``datasets`` all read the result without a
toolrollout import.

A parquet file is only readable once its footer is written, so a process killed mid-run
loses a :class:`TrajectoryWriter` file. :class:`ShardWriter` is the crash-safe form: every
flush is a complete, small parquet file (``part-000000.parquet``...) written to a temporary
name, fsynced and renamed into place, so a shard on disk is always whole. A directory of
shards is a parquet dataset in its own right, and :func:`compact_shards` merges it into one
file without duplicates.
"""

from __future__ import annotations

import base64
import builtins
import dataclasses
import io
import json
import os
import pickle
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import pyarrow as pa
import pyarrow.parquet as pq

from toolrollout._exceptions import UserError
from toolrollout._records import Trajectory, TrajectoryStatus

__all__ = [
    "LEFTOVER_SCHEMA",
    "TRAJECTORY_SCHEMA",
    "ShardWriter",
    "TrajectoryWriter",
    "compact_shards",
    "done_samples",
    "read_leftover",
    "read_rows",
    "read_shards",
    "write_leftover",
    "write_trajectories",
]

_SHARD_GLOB = "part-*.parquet"

TRAJECTORY_SCHEMA = pa.schema(
    [
        pa.field("uid", pa.string(), nullable=False),
        pa.field("group_id", pa.string(), nullable=False),
        pa.field("prompt_index", pa.int64(), nullable=False),
        pa.field("sample_index", pa.int64(), nullable=False),
        pa.field("prompt_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("response_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("loss_mask", pa.list_(pa.int8()), nullable=False),
        pa.field("rollout_logprobs", pa.list_(pa.float32()), nullable=False),
        pa.field("messages", pa.string(), nullable=False),
        pa.field("reward", pa.float64()),
        pa.field("status", pa.string(), nullable=False),
        pa.field("finish_reason", pa.string()),
        pa.field("error", pa.string()),
        pa.field("num_turns", pa.int32(), nullable=False),
        pa.field("num_tool_calls", pa.int32(), nullable=False),
        pa.field("tool_errors", pa.int32(), nullable=False),
        pa.field("parse_errors", pa.int32(), nullable=False),
        pa.field("weight_version", pa.string()),
        pa.field("metrics", pa.string(), nullable=False),
        pa.field("failed", pa.bool_(), nullable=False),
        pa.field("turn_rewards", pa.list_(pa.float64()), nullable=False),
        pa.field("tool_rewards", pa.list_(pa.float64()), nullable=False),
        pa.field("tool_final_rewards", pa.map_(pa.string(), pa.float64()), nullable=False),
        # PNG bytes of each image the model saw, and its placeholder span in
        # prompt_ids + response_ids (see docs/multimodal.md).
        pa.field("images", pa.list_(pa.binary())),
        pa.field(
            "image_spans",
            pa.list_(pa.struct([pa.field("start", pa.int32()), pa.field("end", pa.int32())])),
        ),
        pa.field("data_source", pa.string()),
    ]
)


class TrajectoryWriter:
    """Streams trajectories to a ``.parquet`` or ``.jsonl`` file as they arrive."""

    def __init__(self, path: str | Path, *, flush_every: int = 64) -> None:
        self.path = Path(path)
        self.format = "jsonl" if self.path.suffix in {".jsonl", ".json"} else "parquet"
        self._flush_every = flush_every
        self._pending: list[dict[str, Any]] = []
        self._parquet: pq.ParquetWriter | None = None
        self._jsonl: Any = None
        self.rows_written = 0

    def __enter__(self) -> Self:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.format == "parquet":
            self._parquet = pq.ParquetWriter(self.path, TRAJECTORY_SCHEMA)
        else:
            self._jsonl = self.path.open("w", encoding="utf-8")
        return self

    def write(self, trajectory: Trajectory) -> None:
        self._pending.append(trajectory.to_row())
        if len(self._pending) >= self._flush_every:
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        if self._parquet is not None:
            table = pa.Table.from_pylist(self._pending, schema=TRAJECTORY_SCHEMA)
            self._parquet.write_table(table)
        elif self._jsonl is not None:
            for row in self._pending:
                self._jsonl.write(_jsonl_line(row))
            self._jsonl.flush()
        self.rows_written += len(self._pending)
        self._pending.clear()

    def close(self) -> None:
        self.flush()
        if self._parquet is not None:
            self._parquet.close()
            self._parquet = None
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def write_trajectories(trajectories: list[Trajectory], path: str | Path) -> Path:
    """Write all ``trajectories`` to ``path`` (parquet, or JSONL by suffix)."""
    with TrajectoryWriter(path) as writer:
        for trajectory in trajectories:
            writer.write(trajectory)
    return Path(path)


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Read a toolrollout output file back as plain rows (messages/metrics JSON-decoded)."""
    path = Path(path)
    if path.suffix in {".jsonl", ".json"}:
        with path.open(encoding="utf-8") as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
        for row in rows:
            row["images"] = [base64.b64decode(text) for text in row.get("images") or ()]
    else:
        rows = pq.read_table(path).to_pylist()
        for row in rows:
            # parquet maps read back as (key, value) pairs
            if isinstance(row.get("tool_final_rewards"), list):
                row["tool_final_rewards"] = dict(row["tool_final_rewards"])
    for row in rows:
        row["messages"] = json.loads(row["messages"])
        row["metrics"] = json.loads(row["metrics"])
    return rows


def _jsonl_line(row: dict[str, Any]) -> str:
    """One JSONL line of a row; image PNG bytes as base64 text (read back by read_rows)."""
    images = [base64.b64encode(png).decode() for png in row.get("images") or ()]
    return json.dumps({**row, "images": images}, ensure_ascii=False) + "\n"


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(table: pa.Table, path: Path, *, jsonl: bool = False) -> None:
    """Write ``table`` to ``path`` so that ``path`` is either absent or complete."""
    tmp = path.with_name(f".{path.name}.tmp")
    if jsonl:
        with tmp.open("w", encoding="utf-8") as fh:
            for row in table.to_pylist():
                fh.write(_jsonl_line(row))
            fh.flush()
            os.fsync(fh.fileno())
    else:
        pq.write_table(table, tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


class ShardWriter:
    """Streams trajectories into a directory of whole parquet shards (crash-safe).

    A shard is written when ``rows_per_shard`` rows are waiting, or on the first write
    after ``flush_seconds``, and at :meth:`close`. A kill loses at most the rows not yet
    flushed; shards already on disk are never rewritten. Numbering continues after the
    shards already in the directory, so a resumed run appends.
    """

    def __init__(
        self, directory: str | Path, *, rows_per_shard: int = 64, flush_seconds: float = 10.0
    ) -> None:
        self.directory = Path(directory)
        self._rows_per_shard = max(rows_per_shard, 1)
        self._flush_seconds = flush_seconds
        self._pending: list[dict[str, Any]] = []
        self._last_flush = time.monotonic()
        self._next = 0
        self.rows_written = 0
        self.shards_written = 0

    def __enter__(self) -> Self:
        self.directory.mkdir(parents=True, exist_ok=True)
        for stale in self.directory.glob(".part-*.tmp"):
            stale.unlink()  # a half-written shard of a killed run
        existing = [int(p.stem.split("-")[1]) for p in self.directory.glob(_SHARD_GLOB)]
        self._next = max(existing, default=-1) + 1
        return self

    def write(self, trajectory: Trajectory) -> None:
        self._pending.append(trajectory.to_row())
        if (
            len(self._pending) >= self._rows_per_shard
            or time.monotonic() - self._last_flush >= self._flush_seconds
        ):
            self.flush()

    def flush(self) -> None:
        self._last_flush = time.monotonic()
        if not self._pending:
            return
        table = pa.Table.from_pylist(self._pending, schema=TRAJECTORY_SCHEMA)
        _write_atomic(table, self.directory / f"part-{self._next:06d}.parquet")
        self._next += 1
        self.shards_written += 1
        self.rows_written += len(self._pending)
        self._pending.clear()

    def close(self) -> None:
        self.flush()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _shard_paths(directory: Path) -> list[Path]:
    return sorted(directory.glob(_SHARD_GLOB)) if directory.is_dir() else []


def read_shards(directory: str | Path) -> pa.Table:
    """All rows of a shard directory as one table (empty when there are none)."""
    paths = _shard_paths(Path(directory))
    tables = [pq.read_table(p, schema=TRAJECTORY_SCHEMA) for p in paths]
    return pa.concat_tables(tables) if tables else TRAJECTORY_SCHEMA.empty_table()


def done_samples(directory: str | Path) -> set[tuple[int, int]]:
    """The (prompt_index, sample_index) pairs that already have a row in ``directory``."""
    table = read_shards(directory).select(["prompt_index", "sample_index"])
    return set(
        zip(
            table.column("prompt_index").to_pylist(),
            table.column("sample_index").to_pylist(),
            strict=True,
        )
    )


def _dedupe_sorted(table: pa.Table) -> pa.Table:
    """One row per (prompt, sample), the first written kept, ordered by (prompt, sample)."""
    seen: set[tuple[int, int]] = set()
    keep: list[int] = []
    pairs: Iterable[tuple[int, int]] = zip(
        table.column("prompt_index").to_pylist(),
        table.column("sample_index").to_pylist(),
        strict=True,
    )
    for i, pair in enumerate(pairs):
        if pair not in seen:
            seen.add(pair)
            keep.append(i)
    table = table.take(pa.array(keep, type=pa.int64()))
    return table.sort_by([("prompt_index", "ascending"), ("sample_index", "ascending")])


def compact_shards(directory: str | Path, out: str | Path) -> int:
    """Merge the shards of ``directory`` into ``out`` (parquet, or JSONL by suffix).

    Duplicated samples keep their first row; rows are ordered by (prompt, sample). The
    file appears atomically. Returns the number of rows written.
    """
    out = Path(out)
    table = _dedupe_sorted(read_shards(directory))
    out.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(table, out, jsonl=out.suffix in {".jsonl", ".json"})
    return int(table.num_rows)


# --- leftover files ------------------------------------------------------------------------
#
# A batch run (straggler control) ends with trajectories that are not in the batch: aborted
# ones with their resume points, and their finished siblings. A leftover file keeps them
# across processes. Each row has the ordinary output columns (so pandas or polars can look
# at it) plus ``state``: the whole Trajectory, resume point included, pickled. The loop's
# resume state (open turn, raw model text, drift checkpoints, interaction rewards so far)
# has no column form, and the columns round float64 logprobs to float32, so only the
# pickle is lossless. It is read back with an unpickler that builds nothing but plain
# Python values and toolrollout's own record classes.

LEFTOVER_FORMAT = 1
_LEFTOVER_KEY = b"toolrollout.leftover"

LEFTOVER_SCHEMA = TRAJECTORY_SCHEMA.append(pa.field("state", pa.binary(), nullable=False))
"""The output columns plus ``state``, the pickled :class:`Trajectory` (resume point too)."""

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


class _LeftoverUnpickler(pickle.Unpickler):
    """Builds plain values and toolrollout classes only: no functions, no other imports."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "builtins" and name in _SAFE_BUILTINS:
            return getattr(builtins, name)
        if (module, name) in _SAFE_GLOBALS:
            return super().find_class(module, name)
        if module == "toolrollout" or module.startswith("toolrollout."):
            found = super().find_class(module, name)
            if isinstance(found, type):  # a record or exception class, never a function
                return found
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a leftover file")


def _rebase_clock(trajectory: Trajectory) -> Trajectory:
    """Make a loaded resume point count its earlier wall time from now, in this process.

    The loop times a trajectory with ``time.perf_counter``, whose zero is per process; the
    time spent before the save (``metrics['total_seconds']``) becomes ``prior_seconds``.
    """
    point = trajectory.resume_point
    if point is None:
        return trajectory
    state = point._state
    spent = float(trajectory.metrics.get("total_seconds", 0.0))
    state = dataclasses.replace(state, prior_seconds=spent, started=time.perf_counter())
    point = dataclasses.replace(point, _state=state)
    return dataclasses.replace(trajectory, resume_point=point)


def write_leftover(
    trajectories: Iterable[Trajectory], path: str | Path, *, info: Mapping[str, Any] | None = None
) -> Path:
    """Save a batch's leftover (see :class:`~toolrollout.rollout.RolloutBatch`) losslessly.

    ``info`` (JSON values) goes into the file's metadata, for the reader to check that the
    run continuing the trajectories uses the same model, tools and ``n``. Parquet only;
    the file appears atomically.
    """
    path = Path(path)
    if path.suffix != ".parquet":
        raise UserError(f"a leftover file is parquet: {path} must end in .parquet")
    rows = []
    for trajectory in trajectories:
        if trajectory.status is TrajectoryStatus.ABORTED and trajectory.resume_point is None:
            raise UserError(f"trajectory {trajectory.uid} is aborted but has no resume point")
        state = pickle.dumps(trajectory, protocol=pickle.HIGHEST_PROTOCOL)
        rows.append({**trajectory.to_row(), "state": state})
    meta = {"format": LEFTOVER_FORMAT, **dict(info or {})}
    schema = LEFTOVER_SCHEMA.with_metadata({_LEFTOVER_KEY: json.dumps(meta).encode()})
    table = pa.Table.from_pylist(rows, schema=schema)
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(table, path)
    return path


def read_leftover(path: str | Path) -> tuple[list[Trajectory], dict[str, Any]]:
    """The trajectories of a leftover file, equal to those written, and its ``info``.

    Aborted ones carry their resume point again, ready for
    :meth:`~toolrollout.rollout.RolloutRunner.resume`. A missing file, or one that is not
    a leftover file of this format, is a one-line :class:`UserError`.
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
            f"{path} is not a leftover file (written by a --target-groups run of "
            "`toolrollout generate` or write_leftover)"
        )
    info = json.loads(raw)
    if info.get("format") != LEFTOVER_FORMAT:
        raise UserError(
            f"{path} is a leftover file of format {info.get('format')!r}; this toolrollout "
            f"reads format {LEFTOVER_FORMAT}"
        )
    trajectories = []
    for index, blob in enumerate(table.column("state").to_pylist()):
        try:
            trajectory = _LeftoverUnpickler(io.BytesIO(blob)).load()
        except Exception as exc:  # any unpickling failure means the same: a bad file
            raise UserError(f"{path} row {index}: unreadable trajectory state ({exc})") from None
        if not isinstance(trajectory, Trajectory):
            raise UserError(f"{path} row {index}: the state is not a trajectory")
        trajectories.append(_rebase_clock(trajectory))
    info.pop("format")
    return trajectories, info
