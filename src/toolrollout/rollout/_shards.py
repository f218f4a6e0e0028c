"""A run's folder of parquet shards: the crash-safe way to write rows, and its ordered end.

Every :class:`ShardWriter` flush is a whole parquet file written atomically, so a shard on
disk is always complete. :func:`finish_shards` merges them, marks the folder ``finished``
in its ``run.json``, then deletes shards, ``run.json`` and the folder, each step durable
before the next: a kill at any instant leaves an unmerged folder (``--resume`` merges the
same rows) or a marked one (:func:`clean_finished` only deletes). ``on_step`` is called at
each of :data:`FINISH_STEPS` (the fault tests kill the process there).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Self

import pyarrow as pa
import pyarrow.parquet as pq

from toolrollout._jsonarg import json_file_object
from toolrollout._records import Trajectory

from ._output import (
    MANIFEST,
    TRAJECTORY_SCHEMA,
    fsync,
    read_run_metadata,
    with_run_metadata,
    write_atomic,
)

__all__ = [
    "FINISH_STEPS",
    "ShardWriter",
    "clean_finished",
    "compact_shards",
    "done_samples",
    "finish_shards",
    "finished_mark",
    "read_shards",
]

_SHARD_GLOB = "part-*.parquet"

FINISH_STEPS = (
    "rows-written",
    "merge-written",
    "merged",
    "marked",
    "shard-deleted",
    "shards-deleted",
    "manifest-deleted",
)
"""The instants between the durable steps of finishing a run, in order (the empty folder is
removed after the last)."""


def _no_step(step: str) -> None:
    """The default ``on_step`` of the finishing functions: nothing to do."""


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
        table = with_run_metadata(table, self._metadata)
        write_atomic(table, self.directory / f"part-{self._next:06d}.parquet")
        self._next += 1
        self.shards_written += 1
        self.rows_written += len(self._pending)
        self._pending.clear()

    def close(self) -> None:
        self.flush()

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _shard_paths(directory: Path) -> list[Path]:
    return sorted(directory.glob(_SHARD_GLOB)) if directory.is_dir() else []


def _all_shards(directory: Path) -> list[Path]:
    """The folder's shards, then those of its worker folders (a distributed run's)."""
    return [*_shard_paths(directory), *sorted(directory.glob(f"*/{_SHARD_GLOB}"))]


def _sample_keys(table: pa.Table) -> list[tuple[int, int]]:
    """The (prompt_index, sample_index) of each row."""
    columns = (table.column("prompt_index").to_pylist(), table.column("sample_index").to_pylist())
    return list(zip(*columns, strict=True))


def read_shards(directory: str | Path) -> pa.Table:
    """All rows of a shard directory as one table (empty when there are none)."""
    paths = _shard_paths(Path(directory))
    tables = [pq.read_table(p, schema=TRAJECTORY_SCHEMA) for p in paths]
    return pa.concat_tables(tables) if tables else TRAJECTORY_SCHEMA.empty_table()


def done_samples(directory: str | Path) -> set[tuple[int, int]]:
    """The (prompt_index, sample_index) pairs that already have a row in ``directory``."""
    return set(_sample_keys(read_shards(directory)))


def _dedupe_sorted(table: pa.Table) -> pa.Table:
    """One row per (prompt, sample), the first written kept, ordered by (prompt, sample)."""
    first: dict[tuple[int, int], int] = {}
    for i, key in enumerate(_sample_keys(table)):
        first.setdefault(key, i)
    table = table.take(pa.array(list(first.values()), type=pa.int64()))
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
    ``metadata``. Returns the number of rows written.
    """
    out = Path(out)
    table = _dedupe_sorted(read_shards(directory))
    # The metadata of the run that wrote the last shard (a resumed run's, which checked
    # that its sampling settings and tokenizer are those of the rows before it).
    shards = _all_shards(Path(directory))
    recorded = next((m for m in map(read_run_metadata, reversed(shards)) if m), None)
    table = with_run_metadata(table, recorded or metadata)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(table, out, before_rename=lambda: on_step("merge-written"))
    return int(table.num_rows)


def finish_shards(
    directory: str | Path,
    out: str | Path,
    *,
    metadata: Mapping[str, Any] | None = None,
    on_step: Callable[[str], None] = _no_step,
) -> int:
    """Merge ``directory`` into ``out``, mark the run finished, then delete the folder;
    returns the rows. Each step is durable before the next starts (see the module's doc).
    """
    directory, out = Path(directory), Path(out)
    on_step("rows-written")
    rows = compact_shards(directory, out, metadata=metadata, on_step=on_step)
    on_step("merged")
    saved = {**_manifest(directory), "finished": {"out": str(out.resolve()), "rows": rows}}
    write_atomic(json.dumps(saved) + "\n", directory / MANIFEST)
    on_step("marked")
    clean_finished(directory, on_step=on_step)
    return rows


def finished_mark(directory: str | Path) -> dict[str, Any] | None:
    """The ``finished`` mark of a shard folder (``out``, ``rows``), or None if unmarked."""
    mark = _manifest(Path(directory)).get("finished")
    return mark if isinstance(mark, dict) else None


def _manifest(directory: Path) -> dict[str, Any]:
    """The folder's ``run.json`` object; empty when there is none (or it is unreadable)."""
    return json_file_object(directory / MANIFEST) or {}


def clean_finished(directory: str | Path, *, on_step: Callable[[str], None] = _no_step) -> None:
    """Delete a merged run's folder: shards first, ``run.json`` last, then the folder.

    Only for a folder whose rows are in the merged file (marked, or already without its
    manifest); deleting in this order keeps the mark until nothing but it is left.
    """
    directory = Path(directory)
    if not directory.exists():
        return
    for i, shard in enumerate(_all_shards(directory)):
        shard.unlink()
        if i == 0:
            fsync(shard.parent)
            on_step("shard-deleted")
    fsync(directory)
    on_step("shards-deleted")
    for entry in directory.iterdir():  # worker folders, temporary files: no rows in them
        if entry.name == MANIFEST:
            continue
        if entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    (directory / MANIFEST).unlink(missing_ok=True)
    fsync(directory)
    on_step("manifest-deleted")
    directory.rmdir()
