"""Prompt and trajectory records handed to trainers, reward functions, metrics and writers.

Frozen, so nothing downstream can alter the tokens a trajectory was trained on; importing
nothing of toolrollout, so rewards and metrics are typed without the loop that makes them.
"""

from __future__ import annotations

import io
import json
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from ._resume import ResumePoint


class TrajectoryStatus(StrEnum):
    """Where a trajectory is in its life; the last four are terminal."""

    PENDING = "pending"
    RUNNING = "running"
    TOOL_CALLING = "tool_calling"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    FAILED = "failed"

    @property
    def is_terminal(self) -> bool:
        return self in ("completed", "truncated", "aborted", "failed")  # a StrEnum: str values


SpanKind = Literal["model", "tool", "interaction"]


def _logprob_array(logprobs: Iterable[float]) -> array[float]:
    """Logprobs as 4-byte floats when that keeps every value exact (SGLang's are float32),
    else as 8-byte floats: what comes back out is always the value that went in."""
    if isinstance(logprobs, array) and logprobs.typecode in "fd":
        return array(logprobs.typecode, logprobs)  # already decided (a span's own array)
    wide = array("d", logprobs)
    narrow = array("f", wide)
    return narrow if narrow == wide else wide


@dataclass(frozen=True, slots=True, init=False)
class TokenSpan:
    """A run of response tokens that came from one source: ``model`` (the engine's ids
    verbatim, loss mask 1, its logprobs), ``tool`` or ``interaction`` (a chat-template delta,
    loss mask 0, logprob 0.0).

    Kept in compact arrays (a rollout holds millions of tokens); ``ids``, ``logprobs`` and
    ``loss_mask`` still read as tuples.
    """

    kind: SpanKind
    id_array: array[int]
    """The ids, as ``array('i')`` (read-only by contract: a span is frozen)."""
    logprob_array: array[float] | None
    """The logprobs, as ``array('f')`` or ``array('d')``; None when every one is 0.0."""

    def __init__(
        self, kind: SpanKind, ids: Iterable[int], logprobs: Iterable[float] | None
    ) -> None:
        """``logprobs=None`` means all 0.0 (an environment span's); a model span needs its own."""
        id_array = array("i", ids)  # copied; every vocabulary fits int32, a larger id raises
        logprob_array: array[float] | None = None
        if logprobs is None:
            if kind == "model":
                raise ValueError("a model span needs the engine's logprobs")
        else:
            logprob_array = _logprob_array(logprobs)
            if len(id_array) != len(logprob_array):
                raise ValueError(f"span has {len(id_array)} ids but {len(logprob_array)} logprobs")
            if kind != "model" and not any(logprob_array):
                logprob_array = None  # an environment span's logprobs are all 0.0: keep none
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "id_array", id_array)
        object.__setattr__(self, "logprob_array", logprob_array)

    def __getstate__(self) -> tuple[str, array[int], array[float] | None]:
        return (self.kind, self.id_array, self.logprob_array)

    def __setstate__(self, state: Sequence[Any]) -> None:
        # Also reads spans pickled before the arrays (state: kind, ids tuple, logprobs tuple).
        kind, ids, logprobs = state
        TokenSpan.__init__(self, kind, ids, logprobs)

    def __hash__(self) -> int:
        return hash((self.kind, self.id_array.tobytes(), self.logprobs))

    @property
    def num_tokens(self) -> int:
        return len(self.id_array)

    @property
    def ids(self) -> tuple[int, ...]:
        return tuple(self.id_array)

    @property
    def logprobs(self) -> tuple[float, ...]:
        if self.logprob_array is None:
            return (0.0,) * len(self.id_array)
        return tuple(self.logprob_array)

    @property
    def loss_mask(self) -> tuple[int, ...]:
        return (1 if self.kind == "model" else 0,) * len(self.id_array)


@dataclass(frozen=True, slots=True)
class RolloutPrompt:
    """One dataset row: the opening messages and, optionally, the ground truth. Loading
    prompts needs nothing of the loop."""

    messages: tuple[dict[str, Any], ...]
    ground_truth: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TrajectoryImage:
    """One image in a trajectory and where its placeholder tokens are.

    ``start``/``end`` index ``prompt_ids + response_ids``; every id in that range is the
    model's image placeholder token, and nothing outside it belongs to this image.
    """

    png: bytes
    start: int
    end: int
    grid_thw: tuple[int, int, int]

    @property
    def num_tokens(self) -> int:
        return self.end - self.start

    def to_pil(self) -> Any:
        """The image as a loaded RGB PIL image."""
        return pil_image(self.png)


def pil_image(png: bytes) -> Any:
    """PNG bytes as a loaded RGB PIL image."""
    from PIL import Image

    image = Image.open(io.BytesIO(png))
    image.load()
    return image.convert("RGB")


@dataclass(frozen=True, slots=True)
class Trajectory:
    """One finished (prompt, sample) rollout: tokens, masks, logprobs, messages, outcome."""

    uid: str
    """Unique id of this sample: ``{group_id}-{sample_index}``."""
    group_id: str
    """Shared by the ``n`` samples of one prompt (a GRPO group)."""
    prompt_index: int
    sample_index: int
    prompt_ids: tuple[int, ...]
    spans: tuple[TokenSpan, ...]
    messages: tuple[dict[str, Any], ...]
    """The conversation in OpenAI format, tool calls and tool results included."""
    status: TrajectoryStatus
    finish_reason: str | None
    """Why the trajectory ended: ``stop``, ``length``, ``max_turns``, ``abort``, ``error``..."""
    error: str | None = None
    reward: float | None = None
    reward_details: dict[str, float] = field(default_factory=dict)
    num_turns: int = 0
    num_tool_calls: int = 0
    tool_errors: int = 0
    parse_errors: int = 0
    weight_version: str | None = None
    """The weight version of the last engine answer (see ``weight_segments`` for each)."""
    metrics: dict[str, Any] = field(default_factory=dict)
    ground_truth: Any = None
    turn_rewards: tuple[float | None, ...] = ()
    """One entry per model turn: the interaction's score of that turn (None: not scored)."""
    tool_rewards: tuple[float | None, ...] = ()
    """One entry per model turn: the summed per-call rewards of its tool calls (None: none)."""
    tool_final_rewards: dict[str, float] = field(default_factory=dict)
    """``calc_reward`` of each stateful tool instance, by tool name, at the end."""
    images: tuple[TrajectoryImage, ...] = ()
    """Images the model saw, in order, each with its placeholder span (multimodal runs)."""
    data_source: str | None = None
    """The dataset row's ``data_source`` (verl's layout), so evaluation can split by source."""
    resume_point: ResumePoint | None = field(default=None, repr=False, compare=False)
    """Set on ``aborted`` trajectories: what :meth:`RolloutRunner.resume` continues from
    (prompt plus partial output, token for token). In memory only, not in the output files."""
    sampling: dict[str, Any] = field(default_factory=dict)
    """How its model turns were sampled: ``temperature``, ``top_p``, ``top_k``, ``min_p``,
    ``max_new_tokens`` (a turn's cap), ``max_response_tokens`` and ``seed`` (the base seed
    each request's seed derives from, with ``seed_round``); empty when not known. A trainer
    that recomputes the old policy's logprobs needs the distribution they came from. Last, so
    the pickled records of leftover format 1 (positional state) still load."""

    @property
    def response_ids(self) -> list[int]:
        out = array("i")
        for span in self.spans:
            out += span.id_array
        return out.tolist()

    @property
    def loss_mask(self) -> list[int]:
        out: list[int] = []
        for span in self.spans:
            out += [1 if span.kind == "model" else 0] * span.num_tokens
        return out

    @property
    def rollout_logprobs(self) -> list[float]:
        out: list[float] = []
        for span in self.spans:
            if span.logprob_array is None:
                out += [0.0] * span.num_tokens
            else:
                out += span.logprob_array.tolist()
        return out

    @property
    def weight_segments(self) -> tuple[tuple[int, int, str | None], ...]:
        """``(start, end, weight_version)`` of every engine answer, as positions in the
        response tokens: which weights sampled which tokens. A model turn resumed across a
        weight update has two segments with different versions. Kept in
        ``metrics["weight_versions"]``, so output and leftover files carry it too."""
        segments = self.metrics.get("weight_versions") or ()
        return tuple((int(s[0]), int(s[1]), None if s[2] is None else str(s[2])) for s in segments)

    @property
    def failed(self) -> bool:
        return self.status is TrajectoryStatus.FAILED

    def to_row(self) -> dict[str, Any]:
        """Flatten to the columns of the parquet/JSONL output (see docs/rollouts.md)."""
        return {
            "uid": self.uid,
            "group_id": self.group_id,
            "prompt_index": self.prompt_index,
            "sample_index": self.sample_index,
            "prompt_ids": list(self.prompt_ids),
            "response_ids": self.response_ids,
            "loss_mask": self.loss_mask,
            "rollout_logprobs": self.rollout_logprobs,
            "messages": json.dumps(list(self.messages), ensure_ascii=False),
            "reward": self.reward,
            "status": str(self.status),
            "finish_reason": self.finish_reason,
            "error": self.error,
            "num_turns": self.num_turns,
            "num_tool_calls": self.num_tool_calls,
            "tool_errors": self.tool_errors,
            "parse_errors": self.parse_errors,
            "weight_version": self.weight_version,
            "metrics": json.dumps(self.metrics, ensure_ascii=False, default=str),
            "failed": self.failed,
            "turn_rewards": list(self.turn_rewards),
            "tool_rewards": list(self.tool_rewards),
            "tool_final_rewards": dict(self.tool_final_rewards),
            "images": [image.png for image in self.images],
            "image_spans": [{"start": i.start, "end": i.end} for i in self.images],
            "data_source": self.data_source,
            "sampling": dict(self.sampling) or None,
        }
