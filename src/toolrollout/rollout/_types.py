"""The values a trajectory's state is made of, and what all trajectories of a run share:
plain records, apart from the rules that change them (:mod:`._state`).
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio

from toolrollout._exceptions import UserError
from toolrollout._records import RolloutPrompt, TokenSpan
from toolrollout.chat import ChatFormat, ParsedTurn, ToolCallParser, VisionFormat
from toolrollout.chat._multimodal import PreparedImage
from toolrollout.engines._base import Engine
from toolrollout.engines._limiter import OrderedLimiter
from toolrollout.engines._scheduling import Scheduler
from toolrollout.engines._types import TokenRuns, token_id_array
from toolrollout.rewards import WeightedReward
from toolrollout.tools import ToolExecutor
from toolrollout.tools._summary import CallRecord

from ._config import RolloutConfig

__all__ = [
    "CallRecord",
    "Counters",
    "EnvStep",
    "ModelTurn",
    "PromptLike",
    "RolloutPrompt",
    "RolloutShared",
    "StopControl",
    "Timing",
    "ToolLedger",
    "Transcript",
    "as_prompt",
    "id_tuple",
    "prerender_prompts",
    "render_prompt",
]


@dataclass(slots=True)
class StopControl:
    """Straggler control shared by one run's trajectories: once ``stopping`` is set no
    engine request is sent, those in ``inflight`` are aborted by rid, and (:meth:`stop`)
    the tool calls running are cancelled."""

    stopping: bool = False
    inflight: dict[str, str] = field(default_factory=dict)
    """rid -> trajectory uid of every engine request being answered now."""
    tool_calls: set[anyio.CancelScope] = field(default_factory=set)
    """The scopes of the tool calls running now, cancelled at the target (unless
    ``RolloutConfig.tools_at_target`` is ``"finish"``)."""

    def stop(self, *, cancel_tools: bool) -> None:
        """The target is met: no new request, and (``cancel_tools``) no tool call goes on."""
        self.stopping = True
        if cancel_tools:
            for scope in self.tool_calls:
                scope.cancel()


@dataclass(slots=True)
class RolloutShared:
    """What a trajectory needs from its surroundings, shared by all trajectories of a run."""

    engine: Engine
    chat: ChatFormat
    parser: ToolCallParser
    tools: ToolExecutor
    config: RolloutConfig
    rewards: Sequence[WeightedReward]
    engine_limiter: OrderedLimiter
    context_length: int | None
    interactions: Mapping[str, Any] = field(default_factory=dict)
    """Interaction objects by name; each row picks one by ``interaction_kwargs.name``."""
    vision: VisionFormat | None = None
    """Placeholder expansion for a vision-language model; None for text models."""
    stop: StopControl | None = None
    """Set by a run with a batch target (straggler control); None: run everything out."""
    scheduler: Scheduler | None = None
    """Client-side scheduling policies of the run (issue 20); None: none configured."""
    drift_limiter: anyio.CapacityLimiter | None = None
    """The one worker thread the end-of-trajectory drift checks share (see
    ``_final_drift_check``); None: they run on the event loop."""
    seed_round: int = 0
    """Which call of its runner this run is (0 for the first): mixed into the per-sample
    seeds, so a trainer calling one runner every step does not replay step 0's samples."""
    rendered_prompts: dict[bytes, array[int]] = field(default_factory=dict)
    """Prompt ids by a 128-bit digest of the JSON of their messages (:func:`render_prompt`)."""


RENDER_CACHE_SIZE = 65_536
"""Most distinct prompts one run keeps rendered; past it, new prompts are not cached."""


def _prompt_key(messages: Sequence[Mapping[str, Any]]) -> bytes | None:
    """The render cache's key of a conversation: a 16-byte digest of its JSON (the JSON
    itself would cost a byte a prompt token); ``None`` when JSON cannot write it (images)."""
    try:
        text = json.dumps(messages, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError):
        return None
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def render_prompt(shared: RolloutShared, messages: Sequence[Mapping[str, Any]]) -> array[int]:
    """The prompt ids of ``messages``, rendered (a millisecond or more of CPU on the loop)
    once per distinct conversation in a run: the ``n`` samples of a prompt share one array,
    which a transcript never changes. One JSON cannot write (images) is rendered every time.
    """
    key = _prompt_key(messages)
    if key is None:
        return array("i", shared.chat.render_prompt(messages))
    ids = shared.rendered_prompts.get(key)
    if ids is None:
        ids = array("i", shared.chat.render_prompt(messages))
        if len(shared.rendered_prompts) < RENDER_CACHE_SIZE:
            shared.rendered_prompts[key] = ids
    return ids


def prerender_prompts(
    shared: RolloutShared, conversations: Iterable[Sequence[Mapping[str, Any]]]
) -> int:
    """Render the conversations not cached yet and tokenize them in one call (cheaper than
    one a prompt, docs/benchmarks.md); returns how many were cached. One the template fails
    on is left out: the trajectory's own render reports the error in its row."""
    cache = shared.rendered_prompts
    keys: list[bytes] = []
    texts: list[str] = []
    for messages in conversations:
        key = _prompt_key(messages)
        if key is None or key in cache or key in keys:
            continue
        if len(cache) + len(keys) >= RENDER_CACHE_SIZE:
            break
        try:
            text = shared.chat.render_text(messages, add_generation_prompt=True)
        except Exception:  # the trajectory renders it again and reports it in its row
            continue
        keys.append(key)
        texts.append(text)
    if not texts:
        return 0
    try:
        encoded = shared.chat.encode_many(texts)
    except Exception:  # each trajectory tokenizes its own prompt again and reports it
        return 0
    for key, ids in zip(keys, encoded, strict=True):
        cache[key] = array("i", ids)
    return len(keys)


@dataclass(frozen=True, slots=True)
class ModelTurn:
    """One model turn as appended: its text, its ids, the parse, how the engine ended it."""

    text: str
    ids: tuple[int, ...]
    parsed: ParsedTurn
    finish: str
    """The engine's ``finish_reason`` type (``stop``, ``length``, ``abort``)."""


@dataclass(frozen=True, slots=True)
class EnvStep:
    """What the environment answers a model turn with: messages to append, as one delta
    (loss mask 0) in a span of ``kind``, and the prepared images they place, in order."""

    kind: Literal["tool", "interaction"]
    messages: tuple[dict[str, Any], ...]
    images: tuple[PreparedImage, ...] = ()


@dataclass(slots=True)
class Transcript:
    """The conversation and its tokens: only ever appended to (an open turn is extended)."""

    messages: list[dict[str, Any]]
    prompt_ids: Sequence[int] = field(default_factory=lambda: array("i"))
    """The rendered prompt; the loop keeps it as ``array('i')`` (4 bytes a token)."""
    spans: list[TokenSpan] = field(default_factory=list)
    open_turn: bool = False
    """The last model turn was cut by an abort mid-generation; the next request continues it."""
    segments: list[tuple[int, int, str | None]] = field(default_factory=list)
    """(start, end, weight_version) of each engine answer within the response tokens."""
    forced: tuple[int, ...] = ()
    """Indexes of spans forced into the model turn after them (the gateway's
    ``tool_choice``): loss mask 0, but part of that turn's text."""

    @property
    def response_len(self) -> int:
        return sum(s.num_tokens for s in self.spans)

    @property
    def model_turns(self) -> int:
        """Model spans so far (one per model turn; an open turn's legs are one span)."""
        return sum(1 for s in self.spans if s.kind == "model")

    def runs(self) -> TokenRuns:
        """Prompt and response ids as the transcript's own arrays (shared, not copied)."""
        return TokenRuns((token_id_array(self.prompt_ids), *(s.id_array for s in self.spans)))

    def ids(self) -> array[int]:
        """Prompt and response ids, one compact array (copied from the spans, no objects)."""
        return self.runs().joined()


_INTS: list[int] = []
"""One int object per token id seen so far, shared by every request's id tuple."""


def id_tuple(ids: Sequence[int]) -> tuple[int, ...]:
    """``tuple(ids)`` whose items are shared int objects: with 10,000 trajectories in
    flight, fresh ints (28 bytes each) would be most of the client's memory."""
    if not ids:
        return ()
    if not _all_non_negative(ids):  # not token ids (a negative index would wrap): no sharing
        return tuple(ids)
    try:
        return tuple(map(_INTS.__getitem__, ids))
    except IndexError:  # an id past the table: grow it to the largest, once
        top = max(ids)
        if top >= _LARGEST_VOCABULARY:  # not a token id: no table that large
            return tuple(ids)
        _INTS.extend(range(len(_INTS), top + 1))
        return tuple(map(_INTS.__getitem__, ids))


_LARGEST_VOCABULARY = 1 << 22
"""Ids past this (4 M; the largest vocabularies have about 260 k) are not shared."""


_HIGH_BYTE = slice(3, None, 4) if sys.byteorder == "little" else slice(0, None, 4)


def _all_non_negative(ids: Sequence[int]) -> bool:
    """Whether no id is negative; for an ``array('i')`` without a Python int per id: the
    sign of an int32 is the top bit of its most significant byte, so those bytes are ASCII.
    """
    if isinstance(ids, array) and ids.typecode == "i" and ids.itemsize == 4:
        return ids.tobytes()[_HIGH_BYTE].isascii()
    return min(ids) >= 0


@dataclass(slots=True)
class Counters:
    num_turns: int = 0
    num_tool_calls: int = 0
    tool_errors: int = 0
    parse_errors: int = 0
    resumes: int = 0
    model_tokens: int = 0
    tool_tokens: int = 0
    cached_tokens: int = 0
    tool_calls_cancelled: int = 0
    """Calls a batch target cancelled while they ran (each ran again on the resume)."""
    weight_version: str | None = None


@dataclass(slots=True)
class Timing:
    prior_seconds: float = 0.0
    """Wall time spent in earlier legs (before the last resume)."""
    started: float = field(default_factory=time.perf_counter)
    generation_seconds: float = 0.0
    tool_seconds: float = 0.0
    tool_latency: dict[str, list[float]] = field(default_factory=dict)

    def total(self) -> float:
        return self.prior_seconds + time.perf_counter() - self.started


@dataclass(slots=True)
class ToolLedger:
    state: dict[str, Any] = field(default_factory=dict)
    """``ToolContext.state``: what the row's tools keep between calls."""
    records: list[CallRecord] = field(default_factory=list)


PromptLike = RolloutPrompt | Mapping[str, Any] | Sequence[Mapping[str, Any]]
"""A prompt as a caller may give it (see :func:`as_prompt`)."""


def as_prompt(row: PromptLike) -> RolloutPrompt:
    """Accept a RolloutPrompt, a ``{"messages": ..., "answer"/"ground_truth": ...}`` row, or
    a bare list of messages."""
    if isinstance(row, RolloutPrompt):
        return row
    if isinstance(row, Mapping):
        messages = row.get("messages", row.get("prompt"))
        if not isinstance(messages, Sequence) or isinstance(messages, str):
            raise UserError("a prompt row needs a 'messages' (or 'prompt') list of messages")
        truth = row.get("ground_truth", row.get("answer"))
        reward_model = row.get("reward_model")
        if truth is None and isinstance(reward_model, Mapping):
            truth = reward_model.get("ground_truth")
        metadata = {
            k: v
            for k, v in row.items()
            if k not in {"messages", "prompt", "ground_truth", "answer"}
        }
        return RolloutPrompt(tuple(dict(m) for m in messages), truth, metadata)
    return RolloutPrompt(tuple(dict(m) for m in row))
