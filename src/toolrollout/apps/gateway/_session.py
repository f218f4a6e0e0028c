"""Sessions and segments: how a harness's requests become token-exact transcripts.

A segment is the rollout loop's own transcript
(:class:`~toolrollout.rollout._state.TrajectoryState`); what the gateway adds is the
matching: which request extends which segment, and why another one starts a new segment
(mismatched tokens are never spliced). See docs/gateway.md, "Segments".
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from toolrollout._records import Trajectory, TrajectoryStatus
from toolrollout.chat import ChatFormat, ParsedTurn
from toolrollout.chat._multimodal import ImageRun, PreparedImage
from toolrollout.engines._types import GenerateResult
from toolrollout.rollout._state import TrajectoryState
from toolrollout.rollout._types import EnvStep

from ._types import ToolCallOut

__all__ = [
    "Candidate",
    "Segment",
    "SegmentReason",
    "Session",
    "comparable",
    "freeze_segment",
    "returned_view",
    "tools_key",
]

SegmentReason = str
"""Why a segment started: ``new`` (the session's first conversation), ``history_rewritten``
(the request did not extend any open segment), ``tools_changed``, ``after_length`` (the
previous model turn was cut, so no template delta can follow it), ``after_overflow``."""


def tools_key(tools: Sequence[Mapping[str, Any]]) -> str:
    """A stable key for a tool set (formats and segments are per tool set)."""
    return json.dumps(list(tools), sort_keys=True, ensure_ascii=False)


def _text_of(content: Any) -> str:
    """The text of a message's content: a string, or the text of its text parts."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        return json.dumps(content, sort_keys=True)
    return "".join(_part_text(part) for part in content)


def _part_text(part: Any) -> str:
    if not isinstance(part, Mapping):
        return str(part)
    if part.get("type") in ("text", "input_text", "output_text"):
        return str(part.get("text", ""))
    return json.dumps(part, sort_keys=True)


def _arguments_value(arguments: Any) -> Any:
    """Call arguments as a value: JSON text is decoded so re-serialised JSON compares equal."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def comparable(message: Mapping[str, Any]) -> tuple[Any, ...]:
    """What must be equal for a sent message to be the one in the transcript.

    SDKs add empty fields (``"name": None``, ``"refusal": None``) and split text into
    parts; those differences are not edits. Call ids are left out: the template renders the
    transcript's own ids, and the tool messages refer to them.
    """
    role = str(message.get("role", ""))
    if role == "developer":
        role = "system"
    calls = tuple(
        (
            str(call.get("function", {}).get("name", "")),
            json.dumps(_arguments_value(call.get("function", {}).get("arguments")), sort_keys=True),
        )
        for call in message.get("tool_calls") or ()
        if isinstance(call, Mapping)
    )
    text = _text_of(message.get("content"))
    if role == "assistant":
        text = text.strip()
    extra = (str(message.get("tool_call_id") or ""),) if role == "tool" else ()
    return (role, text, calls, *extra)


@dataclass
class Candidate:
    """One sampled answer not yet taken into a segment (``n > 1``: the harness picks one)."""

    result: GenerateResult
    text: str
    parsed: ParsedTurn
    """The turn's parse (the rollout loop's: ``parse_model_turn``)."""
    message: dict[str, Any]
    """The assistant message in the family's form (what the template renders)."""
    returned: tuple[Any, ...]
    """:func:`comparable` of what the harness was sent, to recognise it when it comes back."""
    extendable: bool
    """Ended on the template's stop token, so a delta can follow it."""
    forced: tuple[int, ...] = ()
    """Ids forced before the model's own (``tool_choice``): in the turn, loss mask 0."""

    @property
    def ids(self) -> tuple[int, ...]:
        return tuple(self.result.output_ids)


@dataclass
class Segment:
    """One token transcript of a session (a row of the output once the session closes)."""

    index: int
    reason: SegmentReason
    parent: int | None
    common_messages: int
    tools_key: str
    state: TrajectoryState
    """The transcript, its counters and its drift checkpoints: the rollout loop's state."""
    returned: list[tuple[Any, ...] | None] = field(default_factory=list)
    """Per message: :func:`comparable` of what the harness saw for an assistant turn."""
    pending: list[Candidate] = field(default_factory=list)
    busy: bool = False
    """A request extending it is being generated (a second one forks a new segment)."""
    open: bool = True
    """False once no request can extend it (its last turn was cut, or it overflowed)."""
    overflowed: bool = False
    """A request that would have extended it did not fit the context."""
    requests: int = 0
    reward: float | None = None
    last_used: float = field(default_factory=time.monotonic)

    @property
    def chat(self) -> ChatFormat:
        return self.state.shared.chat

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.state.transcript.messages

    @property
    def num_tokens(self) -> int:
        t = self.state.transcript
        return len(t.prompt_ids) + t.response_len

    @property
    def num_tool_calls(self) -> int:
        return self.state.counters.num_tool_calls

    def ids(self) -> list[int]:
        """The whole transcript: prompt, then every span."""
        return list(self.state.transcript.ids())

    def extension(self, sent: Sequence[Mapping[str, Any]]) -> tuple[int | None, int]:
        """How ``sent`` relates to this segment: (the pending candidate it takes, or -1 for
        none; None when it does not extend) and the number of leading messages in common."""
        common = 0
        for ours, theirs in zip(self.messages, sent, strict=False):
            expected = self.returned[common] or comparable(ours)
            if comparable(theirs) != expected:
                return None, common
            common += 1
        if common < len(self.messages):
            return None, common
        rest = list(sent[common:])
        taken = -1
        if self.pending:
            if not rest or rest[0].get("role") != "assistant":
                return None, common
            back = comparable(rest[0])
            matches = [i for i, c in enumerate(self.pending) if c.returned == back]
            if not matches:
                return None, common
            taken = matches[0]
            if not self.pending[taken].extendable:
                return None, common
            rest = rest[1:]
            common += 1
        if (
            not self.open
            or self.busy
            or not rest
            or any(m.get("role") == "assistant" for m in rest)
        ):
            return None, common
        if self.messages and self.messages[-1].get("role") != "assistant" and taken < 0:
            return None, common  # a request repeated before its answer was taken
        return taken, common

    def take(self, candidate: Candidate) -> None:
        """Append a model turn the rollout loop's way: engine ids verbatim (loss mask 1);
        ids forced before them (``tool_choice``) in a span of their own with loss mask 0."""
        state = self.state
        state.append_model_turn(
            candidate.result, forced=candidate.forced, parsed=(candidate.text, candidate.parsed)
        )
        # The gateway is the environment: its calls count as the harness receives them.
        state.counters.num_tool_calls += len(candidate.parsed.tool_calls)
        self.returned.append(candidate.returned)
        self.pending = []
        if not candidate.extendable:
            self.open = False  # a cut turn: no template boundary to append a delta at

    def append_messages(
        self,
        messages: Sequence[Mapping[str, Any]],
        delta: Sequence[int],
        images: Sequence[PreparedImage] = (),
        runs: Sequence[ImageRun] = (),
    ) -> None:
        """Append harness messages as their template delta (loss mask 0), the rollout
        loop's environment turn (a tool turn when every message is a tool result)."""
        kind: Literal["tool", "interaction"] = (
            "tool" if all(m.get("role") == "tool" for m in messages) else "interaction"
        )
        step = EnvStep(kind, tuple(dict(m) for m in messages), tuple(images))
        if not self.state.append_env_turn(step, delta=(delta, runs)):
            raise AssertionError("a delta the engine was sent did not fit the context")
        self.returned.extend([None] * len(messages))

    @property
    def has_model_turn(self) -> bool:
        return self.state.counters.num_turns > 0 or bool(self.pending)


@dataclass
class Session:
    """A harness's sessions share a key; its segments live here until it is closed."""

    key: str
    ordinal: int
    group_id: str
    segments: list[Segment] = field(default_factory=list)
    requests: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    reward: float | None = None
    last_used: float = field(default_factory=time.monotonic)
    closed: bool = False

    def metrics(self) -> dict[str, Any]:
        """Per-session figures (also served by ``GET /v1/sessions/{id}``)."""
        states = [s.state for s in self.segments]
        return {
            "session": self.key,
            "requests": self.requests,
            "segments": len(self.segments),
            "open_segments": sum(1 for s in self.segments if s.open),
            "model_turns": sum(s.counters.num_turns for s in states),
            "model_tokens": sum(s.counters.model_tokens for s in states),
            "harness_tokens": sum(
                len(s.transcript.prompt_ids)
                + s.counters.tool_tokens
                + s.environment.interaction_tokens
                for s in states
            ),
            "generation_seconds": round(sum(s.timing.generation_seconds for s in states), 6),
            "errors": dict(self.errors),
            "reward": self.reward,
            "closed": self.closed,
        }


def freeze_segment(session: Session, segment: Segment, *, assumed_choice: bool) -> Trajectory:
    """A segment as a trajectory row (one per segment, ``sample_index`` = its index): the
    rollout loop's freeze, after its drift check of the whole transcript."""
    if segment.pending:
        segment.take(segment.pending[0])
    state = segment.state
    if segment.overflowed:
        state.finish(TrajectoryStatus.TRUNCATED, "context_length_exceeded")
    elif not state.finished:
        state.finish(TrajectoryStatus.COMPLETED, "stop")
    if state.shared.config.drift_check:
        state.drift.final_check(state.drift_view())
    row = state.freeze()
    transcript_forced = state.transcript.forced
    forced: list[list[int]] = []
    offset = 0
    for index, span in enumerate(row.spans):
        if index in transcript_forced:
            forced.append([offset, span.num_tokens])
        offset += span.num_tokens
    metrics: dict[str, Any] = {
        **row.metrics,
        "gateway": {
            "session": session.key,
            "segment": segment.index,
            "segment_reason": segment.reason,
            "parent_segment": segment.parent,
            "common_messages": segment.common_messages,
            "requests": segment.requests,
            "assumed_choice_0": assumed_choice,
            "forced_tokens": forced,
            "errors": dict(session.errors),
        },
    }
    reward = segment.reward if segment.reward is not None else session.reward
    messages = tuple({**m, "content": _plain_images(m["content"])} if "content" in m else m
                     for m in row.messages)  # fmt: skip
    return dataclasses.replace(row, messages=messages, reward=reward, metrics=metrics)


def _plain_images(content: Any) -> Any:
    """Image parts as the rollout loop writes them (``{"type": "image"}``: the pixels are
    in the row's ``images``), without the gateway's matching digest."""
    if not isinstance(content, list):
        return content
    return [
        {"type": "image"} if isinstance(p, Mapping) and p.get("type") == "image" else p
        for p in content
    ]


def returned_view(content: str, calls: Sequence[ToolCallOut]) -> tuple[Any, ...]:
    """:func:`comparable` of the assistant message a harness builds from a choice."""
    return comparable(
        {
            "role": "assistant",
            "content": content,
            "tool_calls": [{"function": {"name": c.name, "arguments": c.arguments}} for c in calls],
        }
    )
