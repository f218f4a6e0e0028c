"""Trajectory records handed to trainers, reward functions, metrics and writers.

Frozen dataclasses: a trajectory is built turn by turn inside the rollout loop and then
frozen, so nothing downstream (reward functions, writers, trainer adapters) can alter the
tokens it was trained on. This module sits at the bottom of the package: everything may
import it and it imports nothing of toolrollout, so that rewards and metrics can be typed
on a trajectory without depending on the loop that makes one.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from ._resume import ResumePoint

__all__ = ["SpanKind", "TokenSpan", "Trajectory", "TrajectoryImage", "TrajectoryStatus"]


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
        return self in _TERMINAL


_TERMINAL = frozenset(
    {
        TrajectoryStatus.COMPLETED,
        TrajectoryStatus.TRUNCATED,
        TrajectoryStatus.ABORTED,
        TrajectoryStatus.FAILED,
    }
)

SpanKind = Literal["model", "tool", "interaction"]


@dataclass(frozen=True, slots=True)
class TokenSpan:
    """A run of response tokens that came from one source.

    ``model`` spans are the engine's output ids verbatim (trained on, loss mask 1, with the
    engine's logprobs); ``tool`` spans are the chat-template delta for tool results plus the
    next generation prompt (not trained on, loss mask 0, logprob 0.0); ``interaction``
    spans are the same for an interaction's user/environment message.
    """

    kind: SpanKind
    ids: tuple[int, ...]
    logprobs: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.ids) != len(self.logprobs):
            raise ValueError(f"span has {len(self.ids)} ids but {len(self.logprobs)} logprobs")

    @property
    def loss_mask(self) -> tuple[int, ...]:
        return (1 if self.kind == "model" else 0,) * len(self.ids)


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
        from PIL import Image

        image = Image.open(io.BytesIO(self.png))
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

    @property
    def resumable(self) -> bool:
        return self.resume_point is not None

    @property
    def response_ids(self) -> list[int]:
        return [i for span in self.spans for i in span.ids]

    @property
    def loss_mask(self) -> list[int]:
        return [m for span in self.spans for m in span.loss_mask]

    @property
    def rollout_logprobs(self) -> list[float]:
        return [lp for span in self.spans for lp in span.logprobs]

    @property
    def weight_segments(self) -> tuple[tuple[int, int, str | None], ...]:
        """``(start, end, weight_version)`` of every engine answer, as positions in the
        response tokens: which weights sampled which tokens. A model turn resumed across a
        weight update has two segments with different versions. Kept in
        ``metrics["weight_versions"]``, so output and leftover files carry it too."""
        segments = self.metrics.get("weight_versions") or ()
        return tuple((int(s[0]), int(s[1]), None if s[2] is None else str(s[2])) for s in segments)

    @property
    def weight_versions(self) -> tuple[str | None, ...]:
        """The distinct weight versions that sampled this trajectory, in order of use."""
        return tuple(dict.fromkeys(v for _, _, v in self.weight_segments))

    @property
    def spans_weight_update(self) -> bool:
        """Whether tokens of this trajectory were sampled by more than one weight version."""
        return len(self.weight_versions) > 1

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
        }
