"""Writing trajectories to parquet and JSONL (the row schema and the run metadata are in
docs/rollouts.md). :class:`TrajectoryWriter` writes rows as trajectories finish, so a long
run keeps its finished work on disk; a parquet file is only readable once its footer is
written, so the crash-safe form is a folder of shards (:mod:`._shards`).
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Self

import pyarrow as pa
import pyarrow.parquet as pq

from toolrollout._exceptions import UserError
from toolrollout._records import Trajectory

__all__ = [
    "MANIFEST",
    "RUN_METADATA_KEY",
    "TRAJECTORY_SCHEMA",
    "TrajectoryWriter",
    "fsync",
    "jsonl_line",
    "read_rows",
    "read_run_metadata",
    "with_run_metadata",
    "write_atomic",
    "write_trajectories",
]

_JSONL_SUFFIXES = frozenset({".jsonl", ".json"})  # any other suffix: parquet

MANIFEST = "run.json"
"""The run manifest in a shard folder (run id, dataset, counts; ``finished`` once merged)."""

SAMPLING_TYPE = pa.struct(
    [
        pa.field("temperature", pa.float64()),
        pa.field("top_p", pa.float64()),
        pa.field("top_k", pa.int64()),
        pa.field("min_p", pa.float64()),
        pa.field("max_new_tokens", pa.int64()),
        pa.field("max_response_tokens", pa.int64()),
        pa.field("seed", pa.int64()),
        pa.field("seed_round", pa.int64()),
    ]
)
"""The ``sampling`` column: :attr:`Trajectory.sampling`'s keys."""

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
        # PNG bytes of each image the model saw and its span (docs/multimodal.md).
        pa.field("images", pa.list_(pa.binary())),
        pa.field(
            "image_spans",
            pa.list_(pa.struct([pa.field("start", pa.int32()), pa.field("end", pa.int32())])),
        ),
        pa.field("data_source", pa.string()),
        # Per row: rows carried over from an earlier run may differ (docs/rollouts.md).
        pa.field("sampling", SAMPLING_TYPE),
    ]
)


RUN_METADATA_KEY = b"toolrollout.run"
"""The key of a parquet file's metadata that says how its rows were made: a JSON object with
``sampling``, ``engine``, ``tokenizer`` and ``toolrollout`` (docs/rollouts.md, Output)."""


def with_run_metadata(table: pa.Table, metadata: Mapping[str, Any] | None) -> pa.Table:
    if not metadata:
        return table
    return table.replace_schema_metadata({RUN_METADATA_KEY: json.dumps(metadata).encode()})


def read_run_metadata(path: str | Path) -> dict[str, Any] | None:
    """The :data:`RUN_METADATA_KEY` object of a parquet file (None: it has none); a
    :class:`UserError` naming the file when the object is not JSON."""
    raw = (pq.read_schema(path).metadata or {}).get(RUN_METADATA_KEY)
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: unreadable {RUN_METADATA_KEY.decode()} metadata ({exc})") from exc
    return value if isinstance(value, dict) else None


class TrajectoryWriter:
    """Streams trajectories to a ``.parquet`` or ``.jsonl`` file as they arrive."""

    def __init__(
        self,
        path: str | Path,
        *,
        flush_every: int = 64,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        """``metadata`` (:data:`RUN_METADATA_KEY`'s object) goes into a parquet file's
        metadata; a JSONL file has no place for it (its rows carry ``sampling``)."""
        self.path = Path(path)
        self._metadata = dict(metadata or {})
        self.format = "jsonl" if self.path.suffix in _JSONL_SUFFIXES else "parquet"
        self._flush_every = flush_every
        self._pending: list[dict[str, Any]] = []
        self._parquet: pq.ParquetWriter | None = None
        self._jsonl: Any = None
        self.rows_written = 0

    def __enter__(self) -> Self:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.format == "parquet":
            schema = with_run_metadata(TRAJECTORY_SCHEMA.empty_table(), self._metadata).schema
            self._parquet = pq.ParquetWriter(self.path, schema)
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
            table = pa.Table.from_pylist(self._pending, schema=self._parquet.schema)
            self._parquet.write_table(table)
        elif self._jsonl is not None:
            self._jsonl.writelines(map(jsonl_line, self._pending))
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

    def __exit__(self, *exc_info: object) -> None:
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
    if path.suffix in _JSONL_SUFFIXES:
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


def jsonl_line(row: dict[str, Any]) -> str:
    """One JSONL line of a row; image PNG bytes as base64 text (read back by read_rows)."""
    images = [base64.b64encode(png).decode() for png in row.get("images") or ()]
    return json.dumps({**row, "images": images}, ensure_ascii=False) + "\n"


def fsync(path: Path) -> None:
    """Make a file's (or a folder's entries') writes durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(
    data: pa.Table | str, path: Path, *, before_rename: Callable[[], None] | None = None
) -> None:
    """Write ``data`` (a table as parquet or, by suffix, JSONL; or text) to ``path`` so that
    ``path`` is either absent or complete."""
    tmp = path.with_name(f".{path.name}.tmp")
    if isinstance(data, pa.Table) and path.suffix not in _JSONL_SUFFIXES:
        pq.write_table(data, tmp)
    else:
        with tmp.open("w", encoding="utf-8") as fh:
            fh.writelines([data] if isinstance(data, str) else map(jsonl_line, data.to_pylist()))
    fsync(tmp)
    if before_rename is not None:
        before_rename()
    os.replace(tmp, path)
    fsync(path.parent)
