"""Checking a checkpoint folder against the one being served, before a server loads it.

vLLM serves a wrongly shaped tensor as a corrupted model and crashes after a missing
folder, so the architecture and every tensor's name and shape (from the safetensors
headers, no tensor loaded) are compared with the served folder's first.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._exceptions import UserError
from .._jsonarg import json_file_object

__all__ = ["CheckpointLayout", "check_compatible", "checkpoint_dtype", "read_layout"]

_MAX_HEADER = 100 * 1024 * 1024
"""A header larger than this is not a safetensors header (the format caps it at 100 MB)."""


@dataclass(frozen=True, slots=True)
class CheckpointLayout:
    """What a checkpoint folder holds, read from its headers."""

    folder: str
    architectures: tuple[str, ...]
    model_type: str | None
    shapes: Mapping[str, tuple[int, ...]]
    """Tensor name -> shape, over every ``*.safetensors`` file of the folder."""


def _header(path: Path) -> dict[str, Any]:
    """The JSON header of one safetensors file, checked against the file's size."""
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise UserError(f"{path}: not a safetensors file (shorter than 8 bytes)")
            (length,) = struct.unpack("<Q", prefix)
            if length > min(_MAX_HEADER, size - 8):
                raise UserError(f"{path}: not a safetensors file (header of {length} bytes)")
            header = json.loads(handle.read(length))
    except OSError as exc:
        raise UserError(f"{path}: cannot be read ({exc})") from None
    except ValueError as exc:
        raise UserError(f"{path}: the safetensors header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise UserError(f"{path}: the safetensors header is not a JSON object")
    data_bytes = size - 8 - length
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and offsets[1] <= data_bytes):
            raise UserError(
                f"{path}: tensor {name!r} lies past the end of the file "
                f"(data_offsets {offsets!r}, {data_bytes} data bytes): a partial write?"
            )
    return header


def read_layout(folder: str | os.PathLike[str]) -> CheckpointLayout:
    """The architecture and tensor shapes of a Hugging Face checkpoint folder."""
    root = Path(folder)
    if not root.is_dir():
        raise UserError(f"checkpoint folder {root} does not exist (or is not a folder)")
    config_path = root / "config.json"
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"{config_path}: cannot be read as JSON ({exc})") from None
    if not isinstance(config, dict):
        raise UserError(f"{config_path}: not a JSON object")
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise UserError(f"checkpoint folder {root} has no *.safetensors file")
    shapes: dict[str, tuple[int, ...]] = {}
    for path in files:
        for name, entry in _header(path).items():
            if name == "__metadata__":
                continue
            shape = entry.get("shape")
            if not isinstance(shape, list) or not all(isinstance(d, int) for d in shape):
                raise UserError(f"{path}: tensor {name!r} has no shape list")
            if name in shapes:
                raise UserError(f"{root}: tensor {name!r} is in more than one file")
            shapes[name] = tuple(shape)
    architectures = config.get("architectures") or ()
    model_type = config.get("model_type")
    return CheckpointLayout(
        folder=str(root),
        architectures=tuple(str(a) for a in architectures),
        model_type=model_type if isinstance(model_type, str) else None,
        shapes=shapes,
    )


def check_compatible(new: CheckpointLayout, served: CheckpointLayout) -> None:
    """Raise :class:`UserError` naming the first difference that would break the served
    model: another architecture or model type, a missing or extra tensor, another shape."""
    where = f"checkpoint {new.folder} does not fit the served model {served.folder}"
    if new.architectures != served.architectures or new.model_type != served.model_type:
        raise UserError(
            f"{where}: architecture {list(new.architectures)} ({new.model_type}), "
            f"served {list(served.architectures)} ({served.model_type})"
        )
    missing = sorted(served.shapes.keys() - new.shapes.keys())
    if missing:
        raise UserError(f"{where}: {len(missing)} tensors missing, e.g. {missing[0]!r}")
    extra = sorted(new.shapes.keys() - served.shapes.keys())
    if extra:
        raise UserError(f"{where}: {len(extra)} tensors it does not have, e.g. {extra[0]!r}")
    for name in sorted(served.shapes):
        if new.shapes[name] != served.shapes[name]:
            raise UserError(
                f"{where}: tensor {name!r} has shape {list(new.shapes[name])}, "
                f"served {list(served.shapes[name])}"
            )


_CONFIG_DTYPES = {"float32": "float32", "float": "float32", "float16": "float16", "half": "float16",
                  "bfloat16": "bfloat16"}  # fmt: skip


def checkpoint_dtype(model_path: str) -> tuple[str, str] | None:
    """The dtype and model type in ``model_path``'s ``config.json`` (float32 when it names
    no dtype, as SGLang assumes), or None when the folder is not readable here."""
    config = json_file_object(Path(model_path) / "config.json")
    if config is None:
        return None
    model_type = str(config.get("model_type") or "")
    text = config.get("text_config")
    for source in (config, text if isinstance(text, dict) else {}):
        value = source.get("dtype") or source.get("torch_dtype")
        if isinstance(value, str):
            return _CONFIG_DTYPES.get(value.removeprefix("torch."), value), model_type
    return "float32", model_type
