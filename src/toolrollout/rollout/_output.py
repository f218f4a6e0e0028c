"""Writing trajectories to parquet and JSONL.

Rows are written as trajectories finish (one row group per flush), so a long run keeps
its finished work on disk instead of in memory. pyarrow is used directly with an explicit
schema: pandas, polars and Hugging Face ``datasets`` all read the result without a
toolrollout import.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import pyarrow as pa
import pyarrow.parquet as pq

from ._trajectory import Trajectory

__all__ = ["TRAJECTORY_SCHEMA", "TrajectoryWriter", "read_rows", "write_trajectories"]

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
                line = {**row, "images": [base64.b64encode(png).decode() for png in row["images"]]}
                self._jsonl.write(json.dumps(line, ensure_ascii=False) + "\n")
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
