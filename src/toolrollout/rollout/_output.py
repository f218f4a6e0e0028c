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

:func:`finish_shards` is the ordered end of a run: merge (temporary name, fsync, rename),
then a ``finished`` mark in the folder's ``run.json`` (also replaced atomically), then the
shards are deleted, ``run.json`` last, then the folder. A kill at any instant leaves either
an unmerged folder (``--resume`` merges the very same rows) or a marked one
(:func:`finished_mark` says so and :func:`clean_finished` only deletes). Both take an
``on_step`` callback, called with each step of :data:`FINISH_STEPS` as it is reached (the
fault tests kill the process there).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import pyarrow as pa
import pyarrow.parquet as pq

from toolrollout._exceptions import UserError
from toolrollout._records import Trajectory

__all__ = [
    "FINISH_STEPS",
    "MANIFEST",
    "RUN_METADATA_KEY",
    "TRAJECTORY_SCHEMA",
    "ShardWriter",
    "TrajectoryWriter",
    "clean_finished",
    "compact_shards",
    "done_samples",
    "finish_shards",
    "finished_mark",
    "read_rows",
    "read_run_metadata",
    "read_shards",
    "write_trajectories",
]

_SHARD_GLOB = "part-*.parquet"

MANIFEST = "run.json"
"""The run manifest in a shard folder (run id, dataset, counts; ``finished`` once merged)."""

FINISH_STEPS = (
    "rows-written",
    "merge-written",
    "merged",
    "marked",
    "shard-deleted",
    "shards-deleted",
    "manifest-deleted",
)
"""The instants between the durable steps of finishing a run, in order: every row is in a
shard; the merged file is written under its temporary name; it is renamed into place; the
``finished`` mark is in ``run.json``; the first shard is deleted; every shard is deleted;
``run.json`` is deleted (the empty folder is removed next)."""


def _no_step(step: str) -> None:
    """The default ``on_step`` of the finishing functions: nothing to do."""


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
        # PNG bytes of each image the model saw, and its placeholder span in
        # prompt_ids + response_ids (see docs/multimodal.md).
        pa.field("images", pa.list_(pa.binary())),
        pa.field(
            "image_spans",
            pa.list_(pa.struct([pa.field("start", pa.int32()), pa.field("end", pa.int32())])),
        ),
        pa.field("data_source", pa.string()),
        # How the row's model turns were sampled (Trajectory.sampling); per row, since rows
        # carried over from an earlier run may differ. The run's settings, engine and
        # tokenizer are also in the file's metadata (RUN_METADATA_KEY).
        pa.field("sampling", SAMPLING_TYPE),
    ]
)


RUN_METADATA_KEY = b"toolrollout.run"
"""The key of a parquet file's metadata that says how its rows were made: a JSON object with
``sampling`` (the run's settings: temperature, top_p, top_k, min_p, max_new_tokens,
max_response_tokens, seed), ``engine`` (``engine``, ``engine_version``, ``dtype``,
``model_path``, ``weight_version``, as the engine's ``info()`` reported them), ``tokenizer``
(``name_or_path``, ``fingerprint``: vocabulary and chat template; ``family``;
``chat_template_kwargs``) and ``toolrollout`` (the writer's version)."""


def _with_run_metadata(table: pa.Table, metadata: Mapping[str, Any] | None) -> pa.Table:
    if not metadata:
        return table
    return table.replace_schema_metadata({RUN_METADATA_KEY: json.dumps(metadata).encode()})


def read_run_metadata(path: str | Path) -> dict[str, Any] | None:
    """The :data:`RUN_METADATA_KEY` object of a parquet file (None: it has none).

    Raises :class:`UserError` naming the file when the object is not JSON.
    """
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
        self.format = "jsonl" if self.path.suffix in {".jsonl", ".json"} else "parquet"
        self._flush_every = flush_every
        self._pending: list[dict[str, Any]] = []
        self._parquet: pq.ParquetWriter | None = None
        self._jsonl: Any = None
        self.rows_written = 0

    def __enter__(self) -> Self:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.format == "parquet":
            schema = _with_run_metadata(TRAJECTORY_SCHEMA.empty_table(), self._metadata).schema
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


def write_atomic(
    table: pa.Table,
    path: Path,
    *,
    jsonl: bool = False,
    before_rename: Callable[[], None] | None = None,
) -> None:
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
    if before_rename is not None:
        before_rename()
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
        self,
        directory: str | Path,
        *,
        rows_per_shard: int = 64,
        flush_seconds: float = 10.0,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        """``metadata`` (:data:`RUN_METADATA_KEY`'s object) goes into every shard, and from
        the shards into the merged file."""
        self.directory = Path(directory)
        self._metadata = dict(metadata or {})
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
        table = _with_run_metadata(table, self._metadata)
        write_atomic(table, self.directory / f"part-{self._next:06d}.parquet")
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


def compact_shards(
    directory: str | Path,
    out: str | Path,
    *,
    metadata: Mapping[str, Any] | None = None,
    on_step: Callable[[str], None] = _no_step,
) -> int:
    """Merge the shards of ``directory`` into ``out`` (parquet, or JSONL by suffix).

    Duplicated samples keep their first row; rows are ordered by (prompt, sample). The
    file appears atomically, with the run metadata of the last shard that has one, else
    ``metadata``. Returns the number of rows written. ``on_step("merge-written")`` is
    called between writing the merged file under its temporary name and the rename.
    """
    out = Path(out)
    table = _dedupe_sorted(read_shards(directory))
    # The metadata of the run that wrote the last shard (a resumed run's, which checked
    # that its sampling settings and tokenizer are those of the rows before it).
    shards = [*_shard_paths(Path(directory)), *sorted(Path(directory).glob(f"*/{_SHARD_GLOB}"))]
    recorded = next((m for m in map(read_run_metadata, reversed(shards)) if m), None)
    table = _with_run_metadata(table, recorded or metadata)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(
        table,
        out,
        jsonl=out.suffix in {".jsonl", ".json"},
        before_rename=lambda: on_step("merge-written"),
    )
    return int(table.num_rows)


def finish_shards(
    directory: str | Path,
    out: str | Path,
    *,
    metadata: Mapping[str, Any] | None = None,
    on_step: Callable[[str], None] = _no_step,
) -> int:
    """Merge ``directory`` into ``out``, mark the run finished, then delete the folder.

    Each step is durable (fsynced) before the next starts, so a kill at any instant leaves
    a folder that either still holds every row (merge again) or carries the ``finished``
    mark (only clean up): never a half-deleted folder without the mark. Returns the rows.
    ``on_step`` is called with each of :data:`FINISH_STEPS` as it is reached.
    """
    directory, out = Path(directory), Path(out)
    on_step("rows-written")
    rows = compact_shards(directory, out, metadata=metadata, on_step=on_step)
    on_step("merged")
    _mark_finished(directory, out, rows)
    on_step("marked")
    clean_finished(directory, on_step=on_step)
    return rows


def finished_mark(directory: str | Path) -> dict[str, Any] | None:
    """The ``finished`` mark of a shard folder (``out``, ``rows``), or None if unmarked."""
    manifest = Path(directory) / MANIFEST
    try:
        saved = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    mark = saved.get("finished") if isinstance(saved, dict) else None
    return mark if isinstance(mark, dict) else None


def _mark_finished(directory: Path, out: Path, rows: int) -> None:
    manifest = directory / MANIFEST
    try:
        saved = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        saved = {}
    saved["finished"] = {"out": str(out.resolve()), "rows": rows}
    tmp = directory / f".{MANIFEST}.tmp"
    with tmp.open("w", encoding="utf-8") as fh:
        fh.write(json.dumps(saved) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, manifest)
    _fsync_dir(directory)


def clean_finished(directory: str | Path, *, on_step: Callable[[str], None] = _no_step) -> None:
    """Delete a merged run's folder: shards first, ``run.json`` last, then the folder.

    Only for a folder whose rows are in the merged file (marked, or already without its
    manifest); deleting in this order keeps the mark until nothing but it is left.
    """
    directory = Path(directory)
    if not directory.exists():
        return
    shards = [*_shard_paths(directory), *sorted(directory.glob(f"*/{_SHARD_GLOB}"))]
    for i, shard in enumerate(shards):
        shard.unlink()
        if i == 0:
            _fsync_dir(shard.parent)
            on_step("shard-deleted")
    _fsync_dir(directory)
    on_step("shards-deleted")
    for entry in directory.iterdir():  # worker folders, temporary files: no rows in them
        if entry.name == MANIFEST:
            continue
        if entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    (directory / MANIFEST).unlink(missing_ok=True)
    _fsync_dir(directory)
    on_step("manifest-deleted")
    directory.rmdir()
