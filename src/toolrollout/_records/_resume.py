"""The resume point of an aborted trajectory: a frozen, versioned, JSON record.

Standard library only, so the trajectory record can refer to it without the run loop
(``rollout/_resume_payload.py`` owns the payload's schema). :func:`to_json_value` /
:func:`from_json_value` are the one lossless codec for the Python values a row may carry
(tuples, bytes, sets, non-string keys, numpy arrays) on top of plain JSON.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "RESUME_FORMAT_VERSION",
    "ResumeFormatError",
    "ResumePoint",
    "from_json_value",
    "to_json_value",
]

RESUME_FORMAT_VERSION: Final = 1
"""Version of the payload layout; a reader refuses a newer one instead of guessing."""

_TAG = "__tr__"
"""Key marking an encoded non-JSON value: ``{"__tr__": kind, "v": ...}``."""


class ResumeFormatError(ValueError):
    """A resume point that this version cannot read (newer version, not a resume point)."""


@dataclass(frozen=True, slots=True)
class ResumePoint:
    """Where an aborted trajectory stopped: what ``RolloutRunner.resume`` continues from.

    ``state`` is the loop's state at the abort as JSON text (what the trajectory's fields
    alone cannot rebuild exactly). It pickles and serialises without any class of the loop.
    """

    state: str
    version: int = RESUME_FORMAT_VERSION

    @property
    def prompt(self) -> Mapping[str, Any]:
        """The dataset row it was started from, as JSON values (messages, ground truth...)."""
        prompt: Mapping[str, Any] = json.loads(self.state)["prompt"]
        return prompt

    def to_json(self) -> str:
        """One JSON object: ``{"resume_format_version": N, "state": {...}}``."""
        return f'{{"resume_format_version": {self.version}, "state": {self.state}}}'

    @classmethod
    def from_json(cls, text: str) -> ResumePoint:
        """Read :meth:`to_json` output back; extra top-level keys are ignored."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ResumeFormatError(f"not a resume point (invalid JSON: {exc})") from None
        if not isinstance(data, dict) or not isinstance(data.get("state"), dict):
            raise ResumeFormatError("not a resume point (no 'state' object)")
        version = data.get("resume_format_version")
        if not isinstance(version, int) or version < 1:
            raise ResumeFormatError(f"not a resume point (version {version!r})")
        if version > RESUME_FORMAT_VERSION:
            raise ResumeFormatError(
                f"resume point version {version} is newer than this toolrollout reads "
                f"(up to {RESUME_FORMAT_VERSION})"
            )
        return cls(json.dumps(data["state"], ensure_ascii=False), version)


def to_json_value(value: Any) -> Any:
    """``value`` as plain JSON values, tagging what JSON alone would change or lose."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [to_json_value(v) for v in value]
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and _TAG not in value:
            return {k: to_json_value(v) for k, v in value.items()}
        return {_TAG: "dict", "v": [[to_json_value(k), to_json_value(v)] for k, v in value.items()]}
    if isinstance(value, tuple):
        return {_TAG: "tuple", "v": [to_json_value(v) for v in value]}
    if isinstance(value, (bytes, bytearray)):
        return {_TAG: "bytes", "v": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, (set, frozenset)):
        return {_TAG: "set", "v": [to_json_value(v) for v in value]}
    if type(value).__module__ == "numpy" and hasattr(value, "dtype"):
        kind = "ndarray" if hasattr(value, "shape") and value.shape != () else "npscalar"
        return {_TAG: kind, "v": to_json_value(value.tolist()), "dtype": str(value.dtype)}
    raise TypeError(f"a {type(value).__name__} is not a JSON value")


def from_json_value(value: Any) -> Any:
    """The inverse of :func:`to_json_value`."""
    if isinstance(value, list):
        return [from_json_value(v) for v in value]
    if not isinstance(value, dict):
        return value
    kind = value.get(_TAG)
    if kind is None:
        return {k: from_json_value(v) for k, v in value.items()}
    inner = value["v"]
    if kind == "dict":
        return {_hashable(from_json_value(k)): from_json_value(v) for k, v in inner}
    if kind == "tuple":
        return tuple(from_json_value(v) for v in inner)
    if kind == "bytes":
        return base64.b64decode(inner)
    if kind == "set":
        return {_hashable(from_json_value(v)) for v in inner}
    if kind in ("ndarray", "npscalar"):
        import numpy as np

        array = np.asarray(from_json_value(inner), dtype=value["dtype"])
        return array if kind == "ndarray" else array[()]
    raise ResumeFormatError(f"unknown encoded value kind {kind!r}")


def _hashable(value: Any) -> Any:
    return tuple(_hashable(v) for v in value) if isinstance(value, list) else value
