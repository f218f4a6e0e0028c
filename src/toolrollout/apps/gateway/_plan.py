"""Where a request's answer goes, and putting it there.

A request is checked and *planned* (:func:`prepare`): matched against its session's open
segments (:func:`plan_answer`: the segment it extends with a template delta, or a new
segment and why), its new images prepared and their placeholders expanded, the context
checked. Once the engine answered, :func:`finish` parses each sample the rollout loop's way,
checks ``tool_choice`` and *commits* the answer to its segment. Planning and committing are
synchronous (no ``await`` between the check and the change; the commit checks again that the
segment is where the plan found it, since images are prepared and the answer generated in
between), so sessions need no lock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
import uuid
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

from toolrollout._exceptions import ImageError, TokenizationError
from toolrollout._records import RolloutPrompt, TrajectoryImage, TrajectoryStatus
from toolrollout.chat import ChatFormat, ParsedTurn
from toolrollout.chat._multimodal import ImageRun
from toolrollout.engines._types import GenerateResult
from toolrollout.rollout._model_turn import parse_model_turn
from toolrollout.rollout._state import TrajectoryState
from toolrollout.rollout._types import RolloutShared
from toolrollout.rollout._vision_turn import record_images

from ._checks import (
    check_tool_choice,
    checked_messages,
    forced_ids,
    image_keys,
    no_vision,
    opens_thinking,
    required_tool,
)
from ._session import Candidate, Segment, Session, returned_view, tools_key
from ._stream import TurnStream
from ._types import ChatChoice, ChatRequest, ChatResult, GatewayError, ToolCallOut, invalid

if TYPE_CHECKING:
    from toolrollout.chat import VisionFormat
    from toolrollout.chat._multimodal import PreparedImage

    from ._types import GatewayConfig

__all__ = [
    "Plan",
    "Prepared",
    "finish",
    "generating",
    "place_images",
    "plan_answer",
    "prepare",
]


@dataclass
class Plan:
    """Where a request's answer goes: an existing segment (extended) or a new one."""

    input_ids: list[int]
    segment: Segment | None
    taken: int
    new_messages: list[dict[str, Any]]
    delta: list[int]
    reason: str = "new"
    parent: int | None = None
    common: int = 0
    images: list[PreparedImage] = field(default_factory=list)
    """The images of the new messages (prepared for the model)."""
    runs: list[ImageRun] = field(default_factory=list)
    """Their placeholder runs, from ``image_offset`` on in the whole ids."""
    image_offset: int = 0
    urls: list[str] = field(default_factory=list)
    """``image_data`` of the whole request: the segment's images so far, then the new."""
    base_images: list[TrajectoryImage] = field(default_factory=list)
    """The extended segment's images when planned (a fork keeps them)."""


@dataclass
class Prepared:
    """A checked request: its format, plan, messages and what generation starts from."""

    shared: RolloutShared
    plan: Plan
    messages: list[dict[str, Any]]
    forced: tuple[int, ...]
    """Ids forced into the answer before the model's own (``tool_choice``), loss mask 0."""
    required: str | None
    """``tool_choice``: None (no call needed), "" (any call) or the tool that must be called."""
    max_new: int

    vision: VisionFormat | None = None

    @property
    def input_ids(self) -> list[int]:
        """The ids sent to the engine: one placeholder per image (the engine expands them
        from ``image_data``, as SGLang does), then the forced ids."""
        ids = self.plan.input_ids
        if self.vision is not None and self.plan.urls:
            ids = self.vision.collapse(ids)
        return [*ids, *self.forced]

    def turn_stream(self, request: ChatRequest) -> TurnStream:
        """The reader of the streamed answer: what of it is safe to show, as it comes."""
        chat, parser = self.shared.chat, self.shared.parser
        enabled = bool(request.tools) and request.tool_choice != "none"
        return TurnStream(
            markers=parser.call_markers if enabled else (),
            think=("<think>", "</think>") if parser.splits_think_tags else None,
            thinking=not self.forced and opens_thinking(chat, self.plan.input_ids),
            stops=tuple(request.stop),
        )


@contextlib.contextmanager
def generating(plan: Plan) -> Iterator[None]:
    """The plan's segment is busy while its answer is generated (not extended meanwhile)."""
    if plan.segment is not None:
        plan.segment.busy = True
    try:
        yield
    finally:
        if plan.segment is not None:
            plan.segment.busy = False


async def prepare(
    session: Session,
    request: ChatRequest,
    shared: RolloutShared,
    *,
    config: GatewayConfig,
    context_length: int | None,
    vision: VisionFormat | None,
) -> Prepared:
    """Check the request, plan where its answer goes and prepare its new images."""
    messages, urls = checked_messages(request)
    if urls and vision is None:
        raise no_vision()
    if not 1 <= request.n <= config.max_n:
        raise invalid(f"n must be between 1 and {config.max_n}")
    chat = shared.chat
    required = required_tool(request)
    forced: tuple[int, ...] = ()
    if required is not None:
        prefix = shared.parser.forced_call_prefix(required or None)
        if prefix is None and required:
            prefix = shared.parser.forced_call_prefix(None)
        forced = forced_ids(chat, prefix) if prefix else ()
    try:
        plan = plan_answer(session, chat, messages, config.max_segments)
    except TokenizationError as exc:
        raise invalid(str(exc)) from None
    if vision is not None and urls:
        await place_images(vision, plan, urls)
    context = context_length
    prompt = len(plan.input_ids) + len(forced)
    if context is not None and prompt >= context:
        if plan.segment is not None:
            plan.segment.overflowed = True
            plan.segment.open = False
        raise GatewayError(
            "context_length_exceeded",
            f"This model's maximum context length is {context} tokens. However, your "
            f"messages resulted in {prompt} tokens. Please reduce the length "
            "of the messages.",
            status=400,
        )
    wanted = request.max_tokens or config.default_max_tokens
    max_new = wanted if context is None else min(wanted, context - prompt)
    return Prepared(shared, plan, messages, forced, required, max_new, vision)


def finish(
    session: Session,
    request: ChatRequest,
    prep: Prepared,
    results: Sequence[GenerateResult],
    seconds: float,
    *,
    config: GatewayConfig,
    streamed: TurnStream | None = None,
) -> ChatResult:
    """Parse the answers, check ``tool_choice``, commit them (sync) and build the result."""
    plan = prep.plan
    enabled = bool(request.tools) and request.tool_choice != "none"
    calls_so_far = plan.segment.num_tool_calls if plan.segment is not None else 0
    choices, candidates = _parse_choices(prep.shared, results, enabled, calls_so_far, prep.forced)
    if prep.required is not None:
        check_tool_choice(choices, prep.required)
    if streamed is not None:
        (choice,) = choices
        streamed.last = streamed.finish(choice.reasoning, choice.content)
        reasoning = streamed.reasoning or choice.reasoning  # what was sent, if any
        choices = [dataclasses.replace(choice, content=streamed.content, reasoning=reasoning)]
        candidates[0].returned = returned_view(streamed.content, choice.tool_calls)
    segment = _commit(
        session, prep.shared, plan, candidates, prep.messages, config.max_open_segments
    )
    if segment is not None:
        segment.requests += 1
        segment.state.timing.generation_seconds += seconds
        segment.last_used = time.monotonic()
    return ChatResult(
        id=f"chatcmpl-{uuid.uuid4().hex}",
        model=request.model or config.model_name,
        created=int(time.time()),
        choices=tuple(choices),
        prompt_tokens=len(plan.input_ids),
        completion_tokens=sum(len(r.output_ids) for r in results),
        cached_tokens=max((r.cached_tokens for r in results), default=0),
    )


async def place_images(vision: VisionFormat, plan: Plan, urls: dict[str, str]) -> None:
    """Prepare the images of the plan's new messages (in a worker thread) and expand
    their placeholders in its ids, as the rollout loop does for a tool's images."""
    wanted = [urls[key] for key in image_keys(plan.new_messages)]
    prepared: list[PreparedImage] = []
    for index, url in enumerate(wanted):
        try:
            prepared.append(await anyio.to_thread.run_sync(vision.prepare, url))
        except (ImageError, ValueError, OSError) as exc:
            raise invalid(f"image {index + 1} of the request: {exc}") from None
    counts = [image.num_tokens for image in prepared]
    base = len(plan.input_ids) - len(plan.delta)
    earlier: list[str] = []
    try:
        if plan.segment is None:
            plan.input_ids, runs = vision.expand(plan.input_ids, counts)
        else:
            delta, runs = vision.expand(plan.delta, counts)
            plan.input_ids = [*plan.input_ids[:base], *delta]
            plan.delta, plan.image_offset = delta, base
            earlier = list(plan.segment.state.vision.urls)
            plan.base_images = list(plan.segment.state.vision.images)
    except ImageError as exc:
        raise invalid(str(exc)) from None
    plan.images, plan.runs = prepared, list(runs)
    plan.urls = [*earlier, *(image.data_url for image in prepared)]


def plan_answer(
    session: Session, chat: ChatFormat, messages: list[dict[str, Any]], max_segments: int
) -> Plan:
    """Match ``messages`` against the session's open segments (sync: no await)."""
    key = tools_key(chat.tools)
    best: tuple[Segment, int, int] | None = None
    nearest: tuple[int, Segment] | None = None
    for segment in session.segments:
        taken, common = segment.extension(messages)
        if nearest is None or common > nearest[0]:
            nearest = (common, segment)
        if taken is None or segment.tools_key != key:
            continue
        if best is None or common > best[2]:
            best = (segment, taken, common)
    if best is not None:
        segment, taken, common = best
        before = list(segment.messages)
        ids = segment.ids()
        if taken >= 0:
            chosen = segment.pending[taken]
            before.append(chosen.message)
            ids.extend(chosen.ids)
        new = messages[common:]
        try:
            delta = chat.tool_turn_delta(before, new)
        except TokenizationError:
            delta = None  # this template cannot extend here: a new segment instead
        if delta is not None:
            return Plan([*ids, *delta], segment, taken, new, delta)
    reason = "new"
    parent: int | None = None
    common = 0
    if nearest is not None:
        common, near = nearest
        parent = near.index
        if near.tools_key != key:
            reason = "tools_changed"
        elif near.overflowed:
            reason = "after_overflow"
        elif common >= len(near.messages) and not near.open:
            reason = "after_length"
        elif near.busy and common >= len(near.messages):
            reason = "concurrent"
        else:
            reason = "history_rewritten"
    if len(session.segments) >= max_segments:
        raise invalid(
            f"session {session.key!r} has {len(session.segments)} segments, the most "
            "--max-segments allows; close it and start a new session"
        )
    prompt = chat.render_prompt(messages)
    return Plan(prompt, None, -1, messages, [], reason, parent, common)


def _parse_choices(
    shared: RolloutShared,
    results: Sequence[GenerateResult],
    tools_enabled: bool,
    calls_so_far: int,
    forced: tuple[int, ...] = (),
) -> tuple[list[ChatChoice], list[Candidate]]:
    """Each sample parsed the rollout loop's way (:func:`parse_model_turn`), as the
    choice the harness gets and the candidate its segment takes."""
    chat = shared.chat
    family = chat.family
    choices: list[ChatChoice] = []
    candidates: list[Candidate] = []
    for index, result in enumerate(results):
        ids = result.output_ids
        text, parsed = parse_model_turn(shared, ids, calls_so_far, forced=forced)
        if not tools_enabled and parsed.tool_calls:
            parsed = ParsedTurn(content=text, reasoning=None)
        call_ids = [call.id for call in parsed.tool_calls]
        message = family.build_assistant_message(text, parsed, call_ids)
        content = text if parsed.errors else parsed.content
        calls = tuple(
            ToolCallOut(call.id, call.name, json.dumps(call.arguments, ensure_ascii=False))
            for call in parsed.tool_calls
        )
        finish = result.finish_reason.type
        reason = "length" if finish == "length" else ("tool_calls" if calls else "stop")
        choices.append(ChatChoice(index, content, parsed.reasoning, calls, reason))  # type: ignore[arg-type]
        candidates.append(
            Candidate(
                result=result,
                text=text,
                parsed=parsed,
                message=message,
                returned=returned_view(content, calls),
                extendable=finish == "stop" and chat.ends_with_stop(ids),
                forced=forced,
            )
        )
    return choices, candidates


def _commit(
    session: Session,
    shared: RolloutShared,
    plan: Plan,
    candidates: list[Candidate],
    messages: list[dict[str, Any]],
    max_open_segments: int,
) -> Segment | None:
    """Put the answer into its segment (sync). A closed session records nothing."""
    if session.closed:
        return None
    segment = plan.segment
    if segment is not None and segment.busy is False and _still_extends(segment, plan):
        if plan.taken >= 0:
            segment.take(segment.pending[plan.taken])
        segment.append_messages(plan.new_messages, plan.delta, plan.images, plan.runs)
    else:
        if segment is not None:
            # Another answer went into it while this one generated: fork. The ids the
            # engine saw are a valid transcript prefix (as prompt, loss mask 0).
            plan = dataclasses.replace(
                plan, reason="concurrent", parent=segment.index, common=len(segment.messages)
            )
        segment = Segment(
            index=len(session.segments),
            reason=plan.reason,
            parent=plan.parent,
            common_messages=plan.common,
            tools_key=tools_key(shared.chat.tools),
            state=_transcript(session, shared, messages, plan),
            returned=[None] * len(messages),
        )
        session.segments.append(segment)
        idle = [s for s in session.segments if s.open and not s.busy]
        while len(idle) > max_open_segments:  # close the least recently used
            oldest = min(idle, key=lambda s: s.last_used)
            oldest.open = False
            idle.remove(oldest)
    if len(candidates) == 1:
        segment.take(candidates[0])
    else:
        segment.pending = candidates
    return segment


def _transcript(
    session: Session, shared: RolloutShared, messages: list[dict[str, Any]], plan: Plan
) -> TrajectoryState:
    """A new segment's transcript: the rollout loop's state, its prompt the ids the engine
    was sent (a fresh render, or for a fork the ids it was generated from)."""
    index = len(session.segments)
    state = TrajectoryState(
        shared,
        RolloutPrompt(messages=tuple(messages)),
        prompt_index=session.ordinal,
        sample_index=index,
        group_id=session.group_id,
        uid=f"{session.key}:{index}",
    )
    state.status = TrajectoryStatus.RUNNING
    state.transcript.prompt_ids = array("i", plan.input_ids)
    state.vision.images = list(plan.base_images)
    state.vision.urls = plan.urls[: len(plan.base_images)]
    record_images(state.vision, plan.images, plan.runs, plan.image_offset)
    return state


def _still_extends(segment: Segment, plan: Plan) -> bool:
    """Whether the segment is still where the plan found it (no other answer went in)."""
    expected = len(plan.input_ids) - len(plan.delta)
    pending = segment.pending[plan.taken].ids if plan.taken >= 0 else ()
    return segment.open and segment.num_tokens + len(pending) == expected
