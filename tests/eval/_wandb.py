"""Reading a W&B offline run back, to check what toolrollout logged into it."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any


def read_wandb_records(path: Path) -> list[Any]:
    """Decode a ``.wandb`` file: a 7-byte W&B header, then LevelDB log records (32 KiB
    blocks; each chunk is crc32c, little-endian length and type: full/first/middle/last)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, records, pending = 32768, 7, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = pb.Record()  # type: ignore[attr-defined]  # a version-picked star import
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records
