"""Crash-safe shards: whole files only, numbering that continues, merging without
duplicates. (The kill -9 test of the CLI is tests/faults/test_faults_resume.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from toolrollout._records import Trajectory
from toolrollout.rollout import (
    RolloutPrompt,
    ShardWriter,
    compact_shards,
    done_samples,
    read_rows,
    read_shards,
)
from toolrollout.rollout._batch import failed_trajectory

PROMPT = RolloutPrompt(({"role": "user", "content": "hi"},), "1")


def row(p: int, s: int, error: str = "boom") -> Trajectory:
    return failed_trajectory(
        group_id=f"run-p{p}",
        prompt_index=p,
        sample_index=s,
        prompt=PROMPT,
        reason="error",
        error=error,
    )


def test_shards_are_whole_files_and_numbering_continues(tmp_path: Path) -> None:
    parts = tmp_path / "o.parquet.parts"
    with ShardWriter(parts, rows_per_shard=2) as writer:
        for s in range(5):
            writer.write(row(0, s))
        # Two full shards are on disk before close; the fifth row waits in memory.
        assert sorted(p.name for p in parts.glob("part-*.parquet")) == [
            "part-000000.parquet",
            "part-000001.parquet",
        ]
    assert writer.rows_written == 5 and writer.shards_written == 3
    for path in parts.glob("part-*.parquet"):
        pq.read_table(path)  # each one is a complete parquet file
    # A half-written shard of a killed process is a hidden temp file: ignored, then removed.
    (parts / ".part-000003.parquet.tmp").write_bytes(b"PAR1 half a file")
    assert done_samples(parts) == {(0, s) for s in range(5)}
    with ShardWriter(parts, rows_per_shard=10) as writer:
        writer.write(row(1, 0))
    assert not list(parts.glob(".*.tmp"))
    assert (parts / "part-000003.parquet").is_file()
    assert read_shards(parts).num_rows == 6


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_compact_orders_and_drops_duplicates(tmp_path: Path, suffix: str) -> None:
    parts = tmp_path / "parts"
    with ShardWriter(parts, rows_per_shard=1) as writer:
        for p, s, error in [(1, 1, "a"), (0, 0, "b"), (1, 0, "c"), (0, 0, "dup"), (0, 1, "d")]:
            writer.write(row(p, s, error))
    out = tmp_path / f"out{suffix}"
    assert compact_shards(parts, out) == 4
    rows = read_rows(out)
    assert [(r["prompt_index"], r["sample_index"]) for r in rows] == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
    ]
    assert [r["error"] for r in rows] == ["b", "d", "c", "a"]  # the first written copy kept
    assert all(r["failed"] and r["reward"] is None for r in rows)
    if suffix == ".jsonl":
        assert len(out.read_text().splitlines()) == 4
        json.loads(out.read_text().splitlines()[0])


def test_an_empty_or_missing_folder_has_no_rows(tmp_path: Path) -> None:
    assert done_samples(tmp_path / "nowhere") == set()
    assert read_shards(tmp_path).num_rows == 0


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_images_survive_shards_and_compaction(tmp_path: Path, suffix: str) -> None:
    """Image PNG bytes go through a shard and the merged file (base64 text in JSONL)."""
    import dataclasses
    import io

    from PIL import Image

    from toolrollout._records import TrajectoryImage

    buffer = io.BytesIO()
    Image.new("RGB", (4, 3), (200, 10, 10)).save(buffer, format="PNG")
    png = buffer.getvalue()
    with_image = dataclasses.replace(row(0, 0), images=(TrajectoryImage(png, 5, 9, (1, 2, 2)),))
    parts = tmp_path / "parts"
    with ShardWriter(parts, rows_per_shard=1) as writer:
        writer.write(with_image)
    out = tmp_path / f"out{suffix}"
    assert compact_shards(parts, out) == 1
    [back] = read_rows(out)
    assert back["images"] == [png]
    assert back["image_spans"] == [{"start": 5, "end": 9}]
