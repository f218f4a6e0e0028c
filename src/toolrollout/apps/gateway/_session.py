"""Sessions and segments: how a harness's requests become token-exact transcripts.

A harness sends its whole conversation on every request, as text. A *segment* is one
token transcript the gateway keeps: the prompt rendered once, then each model turn's engine
ids verbatim and, between them, the chat template's delta for the messages the harness
added (tool results, user turns), exactly as the rollout loop builds a trajectory
(:meth:`~toolrollout.chat.ChatFormat.tool_turn_delta`). A request *extends* a segment
when its messages start with the segment's messages (the assistant turns compared with
what the gateway returned for them: content and parsed tool calls) and add only
non-assistant messages after the last model turn. Anything else (an edited, dropped or
summarised message, changed tools, a turn cut at its token limit) starts a new segment of
the same session, which records why and which segment it came from: mismatched tokens are
never spliced.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from toolrollout._records import TokenSpan, Trajectory, TrajectoryImage, TrajectoryStatus
from toolrollout._records._trajectory import SpanKind
from toolrollout.chat import ChatFormat

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
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, Mapping):
                if part.get("type") in ("text", "input_text", "output_text"):
                    parts.append(str(part.get("text", "")))
                else:
                    parts.append(json.dumps(part, sort_keys=True))
            else:
                parts.append(str(part))
        return "".join(parts)
    return json.dumps(content, sort_keys=True)


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

    ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    text: str
    message: dict[str, Any]
    """The assistant message in the family's form (what the template renders)."""
    returned: tuple[Any, ...]
    """:func:`comparable` of what the harness was sent, to recognise it when it comes back."""
    finish: str
    weight_version: str
    tool_calls: int
    parse_errors: int
    extendable: bool
    """Ended on the template's stop token, so a delta can follow it."""
    forced: tuple[int, ...] = ()
    """Ids forced before the model's own (``tool_choice``): in the turn, loss mask 0."""


@dataclass
class Segment:
    """One token transcript of a session (a row of the output once the session closes)."""

    index: int
    reason: SegmentReason
    parent: int | None
    common_messages: int
    chat: ChatFormat
    tools_key: str
    messages: list[dict[str, Any]]
    prompt_ids: tuple[int, ...]
    spans: list[TokenSpan] = field(default_factory=list)
    model_texts: list[str] = field(default_factory=list)
    returned: list[tuple[Any, ...] | None] = field(default_factory=list)
    """Per message: :func:`comparable` of what the harness saw for an assistant turn."""
    pending: list[Candidate] = field(default_factory=list)
    busy: bool = False
    """A request extending it is being generated (a second one forks a new segment)."""
    open: bool = True
    """False once no request can extend it (its last turn was cut, or it overflowed)."""
    last_finish: str | None = None
    finish_reason: str | None = None
    num_turns: int = 0
    num_tool_calls: int = 0
    parse_errors: int = 0
    requests: int = 0
    model_tokens: int = 0
    env_tokens: int = 0
    cached_tokens: int = 0
    generation_seconds: float = 0.0
    forced: list[tuple[int, int]] = field(default_factory=list)
    images: list[TrajectoryImage] = field(default_factory=list)
    """The images in the transcript, each with its placeholder run (as the rollout records)."""
    """Forced ids in the response: (offset into the response ids, count), per forced turn."""
    weight_version: str | None = None
    reward: float | None = None
    created: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.monotonic)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + sum(len(span.ids) for span in self.spans)

    def ids(self) -> list[int]:
        """The whole transcript: prompt, then every span."""
        out = list(self.prompt_ids)
        for span in self.spans:
            out.extend(span.ids)
        return out

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
        """Append a model turn: engine ids verbatim (loss mask 1) and its message; ids forced
        before them (``tool_choice``) go first, in a span of their own with loss mask 0."""
        if candidate.forced:
            self.forced.append((self.num_tokens - len(self.prompt_ids), len(candidate.forced)))
            self.spans.append(TokenSpan("interaction", candidate.forced, None))
        self.spans.append(TokenSpan("model", candidate.ids, candidate.logprobs))
        self.model_texts.append(candidate.text)
        self.messages.append(candidate.message)
        self.returned.append(candidate.returned)
        self.num_turns += 1
        self.num_tool_calls += candidate.tool_calls
        self.parse_errors += candidate.parse_errors
        self.model_tokens += len(candidate.ids)
        self.weight_version = candidate.weight_version
        self.last_finish = candidate.finish
        self.pending = []
        if not candidate.extendable:
            self.open = False  # a cut turn: no template boundary to append a delta at

    def append_messages(self, messages: Sequence[Mapping[str, Any]], delta: Sequence[int]) -> None:
        """Append harness messages as their template delta (loss mask 0, logprob 0.0)."""
        kind: SpanKind = "tool" if all(m.get("role") == "tool" for m in messages) else "interaction"
        self.spans.append(TokenSpan(kind, tuple(delta), (0.0,) * len(delta)))
        self.env_tokens += len(delta)
        for message in messages:
            self.messages.append(dict(message))
            self.returned.append(None)

    @property
    def has_model_turn(self) -> bool:
        return self.num_turns > 0 or bool(self.pending)


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
    created: float = field(default_factory=time.time)
    closed: bool = False

    def metrics(self) -> dict[str, Any]:
        """Per-session figures (also served by ``GET /v1/sessions/{id}``)."""
        return {
            "session": self.key,
            "requests": self.requests,
            "segments": len(self.segments),
            "open_segments": sum(1 for s in self.segments if s.open),
            "model_turns": sum(s.num_turns for s in self.segments),
            "model_tokens": sum(s.model_tokens for s in self.segments),
            "harness_tokens": sum(s.env_tokens + len(s.prompt_ids) for s in self.segments),
            "generation_seconds": round(sum(s.generation_seconds for s in self.segments), 6),
            "errors": dict(self.errors),
            "reward": self.reward,
            "closed": self.closed,
        }


def freeze_segment(session: Session, segment: Segment, *, assumed_choice: bool) -> Trajectory:
    """A segment as a trajectory row (one per segment, ``sample_index`` = its index)."""
    if segment.pending:
        segment.take(segment.pending[0])
    if segment.finish_reason is not None:
        finish = segment.finish_reason
    else:
        finish = segment.last_finish or "stop"
    status = TrajectoryStatus.TRUNCATED if finish != "stop" else TrajectoryStatus.COMPLETED
    reward = segment.reward if segment.reward is not None else session.reward
    messages = tuple(
        {k: _plain_images(v) if k == "content" else v for k, v in m.items() if k != "raw_content"}
        for m in segment.chat.presented_messages(segment.messages)
    )
    metrics: dict[str, Any] = {
        "gateway": {
            "session": session.key,
            "segment": segment.index,
            "segment_reason": segment.reason,
            "parent_segment": segment.parent,
            "common_messages": segment.common_messages,
            "requests": segment.requests,
            "assumed_choice_0": assumed_choice,
            "forced_tokens": [list(item) for item in segment.forced],
            "errors": dict(session.errors),
        },
        "model_tokens": segment.model_tokens,
        "tool_tokens": segment.env_tokens,
        "cached_tokens": segment.cached_tokens,
        "generation_seconds": round(segment.generation_seconds, 6),
        "drift_mismatches": 0,
    }
    return Trajectory(
        uid=f"{session.key}:{segment.index}",
        group_id=session.group_id,
        prompt_index=session.ordinal,
        sample_index=segment.index,
        prompt_ids=segment.prompt_ids,
        spans=tuple(segment.spans),
        messages=messages,
        status=status,
        finish_reason=finish,
        reward=reward,
        num_turns=segment.num_turns,
        num_tool_calls=segment.num_tool_calls,
        parse_errors=segment.parse_errors,
        weight_version=segment.weight_version,
        metrics=metrics,
        turn_rewards=(None,) * segment.num_turns,
        tool_rewards=(None,) * segment.num_turns,
        images=tuple(segment.images),
    )


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
