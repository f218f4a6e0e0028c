"""The gateway core: one :class:`ChatRequest` in, one :class:`ChatResult` out, recorded.

:class:`Gateway` holds the engine, the tokenizer's chat formats (one per tool set), the
open sessions and the writer. Every API layer (Chat Completions, Responses, Messages)
translates its request into a :class:`ChatRequest` and calls :meth:`Gateway.complete`
(or :meth:`Gateway.stream`, which yields the answer as the engine decodes it); the session
matching, the template deltas, ``tool_choice``, images, the limits and the records live
here once.

A segment is the rollout loop's transcript (:class:`~toolrollout.rollout._state.TrajectoryState`
with the :class:`~toolrollout.rollout._types.RolloutShared` of its tool set): model turns,
template deltas, drift checkpoints and the frozen row are the loop's code, not a copy.

Concurrency: one event loop serves every session, in structured tasks (anyio task groups:
the idle reaper lives in the gateway's, the ``n`` samples of a request in the request's).
Matching a request to a segment and committing its answer are synchronous sections (no
``await`` in between the check and the change; the commit checks again that the segment is
where the plan found it, since images are prepared and the answer generated in between),
so sessions need no lock; generation itself waits on a capacity limiter
(``max_concurrency`` in flight) and a bounded waiting line (``max_waiting``), beyond which
requests are answered ``overloaded`` at once instead of piling up on the loop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import shutil
import time
import uuid
from array import array
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import anyio

from toolrollout._exceptions import (
    ImageError,
    OverlongPromptError,
    TokenizationError,
    ToolRolloutError,
    UserError,
)
from toolrollout._records import RolloutPrompt, Trajectory, TrajectoryImage, TrajectoryStatus
from toolrollout.chat import ChatFormat, ParsedTurn
from toolrollout.chat._multimodal import ImageRun
from toolrollout.chat.parsers import get_tool_parser
from toolrollout.engines._limiter import OrderedLimiter
from toolrollout.engines._types import (
    GenerateRequest,
    GenerateResult,
    SamplingParams,
    token_id_array,
)
from toolrollout.rollout._config import RolloutConfig
from toolrollout.rollout._state import TrajectoryState, parse_model_turn
from toolrollout.rollout._types import RolloutShared
from toolrollout.rollout._vision_turn import record_images
from toolrollout.tools import ToolExecutor

from ._session import (
    Candidate,
    Segment,
    Session,
    freeze_segment,
    returned_view,
    tools_key,
)
from ._stream import IncrementalText, TurnStream
from ._types import (
    ChatChoice,
    ChatRequest,
    ChatResult,
    GatewayError,
    StreamDelta,
    StreamStart,
    ToolCallOut,
)

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from toolrollout.chat import VisionFormat
    from toolrollout.chat._multimodal import PreparedImage
    from toolrollout.engines import Engine
    from toolrollout.rollout import ShardWriter
    from toolrollout.spec import RunSpec

__all__ = ["Gateway", "GatewayConfig"]

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


@dataclass(frozen=True, kw_only=True)
class GatewayConfig:
    """Limits and model options of a gateway (every one has a CLI flag of the same name).

    ``context_length`` None: the engine's. ``idle_timeout`` None: sessions close only when
    told. ``max_segments`` bounds one session's memory (each segment holds at most a
    context of ids); ``max_open_segments`` bounds the segments a request is matched against
    (the least recently used one stops being extendable beyond it).
    """

    model_name: str = "toolrollout"
    family: str | None = None
    tool_parser: str | None = None
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    context_length: int | None = None
    default_max_tokens: int = 1024
    max_n: int = 16
    max_concurrency: int = 64
    max_waiting: int = 1024
    request_timeout: float = 600.0
    idle_timeout: float | None = 600.0
    max_sessions: int = 4096
    max_segments: int = 64
    max_open_segments: int = 8
    max_stored_responses: int = 1024
    """Responses kept for ``previous_response_id`` and ``GET /v1/responses/{id}`` (the
    least recently used is dropped beyond it)."""
    max_records: int = 10_000
    """Closed sessions' rows kept in memory for :meth:`Gateway.records` (newest kept)."""
    flush_seconds: float = 10.0

    def __post_init__(self) -> None:
        for name in (
            "max_n",
            "max_concurrency",
            "max_waiting",
            "max_sessions",
            "max_segments",
            "max_stored_responses",
        ):
            if int(getattr(self, name)) < 1:
                raise UserError(f"--{name.replace('_', '-')} must be at least 1")
        if self.max_open_segments < 1:
            raise UserError("--max-open-segments must be at least 1")
        if not self.request_timeout > 0:
            raise UserError("--request-timeout must be positive")
        if self.idle_timeout is not None and not self.idle_timeout > 0:
            raise UserError("--idle-timeout must be positive")
        if self.tool_parser is not None:
            get_tool_parser(self.tool_parser)  # an unknown name fails now, not per request


@dataclass
class _Plan:
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
class _Prepared:
    """A checked request: its format, plan, messages and what generation starts from."""

    shared: RolloutShared
    plan: _Plan
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


class Gateway:
    """Serve harness model calls through a toolrollout engine, recording token-exact sessions.

    ``async with Gateway(engine, tokenizer, out=path) as gateway:`` then ``await
    gateway.complete(request)``; closing the gateway closes every session and, with
    ``out``, merges the crash-safe shards (``<out>.parts/``) into ``out``. The engine is
    the caller's (opened and closed by it); :meth:`open` builds both from a
    :class:`~toolrollout.spec.RunSpec` as ``generate`` does.
    """

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        *,
        config: GatewayConfig | None = None,
        out: str | Path | None = None,
        context_length: int | None = None,
        flush_every: int = 64,
        vision: VisionFormat | None = None,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.vision = vision
        """The model's image format (None: a text model; requests with images are refused)."""
        self.config = config or GatewayConfig()
        self.context_length = self.config.context_length or context_length
        self.out = None if out is None else Path(out)
        self._flush_every = flush_every
        self._shared: dict[str, RolloutShared] = {}
        self._rollout_config = RolloutConfig(
            max_response_tokens=2**31 - 1,  # the gateway's limit is the context (checked first)
            max_tool_response_tokens=2**31 - 1,
        )
        self._sessions: dict[str, Session] = {}
        self._ordinal = 0
        self._records: deque[Trajectory] = deque(maxlen=self.config.max_records)
        self._limiter = anyio.CapacityLimiter(self.config.max_concurrency)
        self._waiting = 0
        self._writer: ShardWriter | None = None
        self._tasks: TaskGroup | None = None
        self._entered = False
        self.stats: dict[str, int] = {"sessions": 0, "requests": 0, "errors": 0, "rows_written": 0}
        # Built now so that a tokenizer without a template, or an unknown family, fails at
        # startup rather than on the first request.
        self.chat_format(())

    # -- construction ---------------------------------------------------------------------

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls,
        spec: RunSpec,
        *,
        config: GatewayConfig | None = None,
        out: str | Path | None = None,
    ) -> AsyncIterator[Gateway]:
        """The gateway of ``spec``'s engine and model, as ``generate`` builds its run.

        The engine (``spec.engine_urls``, or the embedded one on ``spec.model``) is
        started, asked for its context length, and closed with the block. ``spec.config``
        gives the family, the tool parser and the template kwargs when ``config`` does not.
        """
        from toolrollout.engines._factory import connect
        from toolrollout.spec import load_components

        components = load_components(spec.replace(tools=()))
        base = config or GatewayConfig()
        chosen = dataclasses.replace(
            base,
            family=base.family or _family_name(spec.config.family),
            tool_parser=base.tool_parser or spec.config.tool_parser,
            template_kwargs=dict(base.template_kwargs) or dict(spec.config.chat_template_kwargs),
        )
        engine = await connect(
            spec.engine_urls,
            spec.model_path,
            threads=spec.threads,
            health_timeout=spec.health_timeout,
            engine=spec.engine,
            **spec.client_options(),
        )
        async with engine:
            context = (await engine.info()).context_length
            async with cls(
                engine,
                components.tokenizer,
                config=chosen,
                out=out,
                context_length=context,
                flush_every=spec.flush_every,
                vision=components.vision,
            ) as gateway:
                yield gateway

    async def __aenter__(self) -> Self:
        if self._entered:
            raise UserError("this Gateway is entered already")
        self._entered = True
        if self.out is not None:
            from toolrollout.rollout import ShardWriter

            if self.out.exists():
                self._entered = False
                raise UserError(
                    f"{self.out} exists already; the gateway writes a new file (choose "
                    "another --out, or move it away)"
                )

            writer = ShardWriter(
                self._parts_folder(),
                rows_per_shard=self._flush_every,
                flush_seconds=self.config.flush_seconds,
            )
            writer.__enter__()
            self._writer = writer
            self._ordinal = _next_ordinal(self._parts_folder())
        tasks = anyio.create_task_group()
        await tasks.__aenter__()
        tasks.start_soon(self._reap)
        self._tasks = tasks
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._tasks is not None:
            tasks, self._tasks = self._tasks, None
            tasks.cancel_scope.cancel()  # the reaper: it only waits between rounds
            await tasks.__aexit__(None, None, None)
        for key in list(self._sessions):
            self.close_session(key)
        if self._writer is not None:
            from toolrollout.rollout import compact_shards

            self._writer.close()
            self._writer = None
            assert self.out is not None
            folder = self._parts_folder()
            if any(folder.glob("part-*.parquet")):
                compact_shards(folder, self.out)
            shutil.rmtree(folder, ignore_errors=True)
        self._entered = False

    def _parts_folder(self) -> Path:
        assert self.out is not None
        return self.out.with_name(f"{self.out.name}.parts")

    # -- formats ------------------------------------------------------------------------

    def chat_format(self, tools: Sequence[Mapping[str, Any]]) -> ChatFormat:
        """The chat format for a tool set (built once per distinct set, at most 64 kept)."""
        return self.shared(tools).chat

    def shared(self, tools: Sequence[Mapping[str, Any]]) -> RolloutShared:
        """What the rollout loop's transcript code needs for a tool set (its chat format
        and parser; the gateway's harness runs the tools, so none here)."""
        key = tools_key(tools)
        found = self._shared.get(key)
        if found is None:
            chat = ChatFormat(
                self.tokenizer,
                tools=list(tools) or None,
                family=self.config.family,
                template_kwargs=self.config.template_kwargs,
            )
            parser = get_tool_parser(
                self.config.tool_parser or chat.family.tool_parser, tools=chat.tools
            )
            found = RolloutShared(
                engine=self.engine,
                chat=chat,
                parser=parser,
                tools=ToolExecutor(),
                config=self._rollout_config,
                rewards=(),
                engine_limiter=OrderedLimiter(1),
                context_length=self.context_length,
                vision=self.vision,
            )
            if len(self._shared) >= 64:
                self._shared.pop(next(iter(self._shared)))
            self._shared[key] = found
        return found

    # -- sessions -----------------------------------------------------------------------

    def sessions(self) -> dict[str, dict[str, Any]]:
        """The open sessions' metrics, by session key."""
        return {key: session.metrics() for key, session in self._sessions.items()}

    def session(self, key: str) -> Session | None:
        """An open session (its live state; read it, do not change it)."""
        return self._sessions.get(key)

    def records(self, session: str | None = None) -> list[Trajectory]:
        """Rows of closed sessions still held in memory (all, or one session's)."""
        rows = list(self._records)
        if session is None:
            return rows
        return [r for r in rows if r.metrics.get("gateway", {}).get("session") == session]

    def attach_reward(self, session: str, reward: float, segment: int | None = None) -> None:
        """Score an open session (every segment), or one of its segments; written at close.

        Rows already written cannot change, so a closed session is refused: score before
        closing, or pass ``reward`` to :meth:`close_session`.
        """
        found = self._sessions.get(session)
        if found is None:
            raise GatewayError(
                "invalid_request",
                f"no open session {session!r}: rewards attach before the session is closed",
                status=404,
            )
        value = _reward_value(reward)
        if segment is None:
            found.reward = value
            return
        for item in found.segments:
            if item.index == segment:
                item.reward = value
                return
        raise GatewayError(
            "invalid_request", f"session {session!r} has no segment {segment}", status=404
        )

    def close_session(self, session: str, reward: float | None = None) -> list[Trajectory]:
        """End a session: its segments with a model turn become rows (written with ``out``)."""
        found = self._sessions.pop(session, None)
        if found is None:
            raise GatewayError("invalid_request", f"no open session {session!r}", status=404)
        if reward is not None:
            found.reward = _reward_value(reward)
        found.closed = True
        rows = [
            freeze_segment(found, segment, assumed_choice=bool(segment.pending))
            for segment in found.segments
            if segment.has_model_turn
        ]
        for row in rows:
            self._records.append(row)
            if self._writer is not None:
                self._writer.write(row)
                self.stats["rows_written"] += 1
        return rows

    def _open_session(self, key: str, metadata: Mapping[str, Any]) -> Session:
        found = self._sessions.get(key)
        if found is not None:
            return found
        if len(self._sessions) >= self.config.max_sessions:
            idle = min(self._sessions.values(), key=lambda s: s.last_used)
            self.close_session(idle.key)
        group = metadata.get("group")
        session = Session(key=key, ordinal=self._ordinal, group_id=str(group) if group else key)
        self._ordinal += 1
        self.stats["sessions"] += 1
        self._sessions[key] = session
        return session

    async def _reap(self) -> None:
        """Close idle sessions and flush the writer, every few seconds."""
        period = min(self.config.flush_seconds, (self.config.idle_timeout or 60.0) / 4, 5.0)
        while True:
            await anyio.sleep(max(period, 0.05))
            timeout = self.config.idle_timeout
            if timeout is not None:
                now = time.monotonic()
                for key, session in list(self._sessions.items()):
                    busy = any(s.busy for s in session.segments)
                    if not busy and now - session.last_used > timeout:
                        self.close_session(key)
            if self._writer is not None:
                self._writer.flush()

    # -- the one entry point ------------------------------------------------------------

    async def complete(self, request: ChatRequest) -> ChatResult:
        """Serve one model call of a harness; raises :class:`GatewayError` for the API."""
        session = self._begin(request)
        try:
            return await self._complete(session, request)
        except GatewayError as exc:
            self._count_error(session, exc)
            raise

    async def stream(
        self, request: ChatRequest
    ) -> AsyncGenerator[StreamStart | StreamDelta | ChatResult, None]:
        """Serve one model call as it is generated: a :class:`StreamStart` once the first
        tokens are decoded, :class:`StreamDelta` s of reasoning and content as they become
        safe to show (never text that may start a tool call), and the :class:`ChatResult`
        last, recorded exactly as :meth:`complete` records it. Errors before the start
        raise :class:`GatewayError` from the first ``__anext__``; closing the iterator early
        aborts the generation and records nothing. With ``n > 1`` the start and the whole
        answer come when every sample is done.
        """
        session = self._begin(request)
        try:
            if request.n != 1:
                result = await self._complete(session, request)
                yield StreamStart(result.id, result.model, result.created, result.prompt_tokens)
                yield result
                return
            async for item in self._stream(session, request):
                yield item
        except GatewayError as exc:
            self._count_error(session, exc)
            raise

    async def count_tokens(self, request: ChatRequest) -> int:
        """The prompt length a new segment of ``request`` would have (each image's
        placeholders expanded); nothing is recorded."""
        messages, urls = _checked_messages(request)
        if urls and self.vision is None:
            raise _no_vision()
        try:
            ids = self.chat_format(request.tools).render_prompt(messages)
        except ToolRolloutError as exc:
            raise GatewayError("invalid_request", str(exc), status=400) from None
        if self.vision is None or not urls:
            return len(ids)
        plan = _Plan(ids, None, -1, messages, [])
        await self._place_images(self.vision, plan, urls)
        return len(plan.input_ids)

    def _begin(self, request: ChatRequest) -> Session:
        self.stats["requests"] += 1
        session = self._open_session(request.session, request.metadata)
        session.requests += 1
        session.last_used = time.monotonic()
        return session

    def _count_error(self, session: Session, exc: GatewayError) -> None:
        self.stats["errors"] += 1
        session.errors[exc.kind] = session.errors.get(exc.kind, 0) + 1

    async def _prepare(self, session: Session, request: ChatRequest) -> _Prepared:
        """Check the request, plan where its answer goes and prepare its new images."""
        messages, urls = _checked_messages(request)
        if urls and self.vision is None:
            raise _no_vision()
        if not 1 <= request.n <= self.config.max_n:
            raise GatewayError(
                "invalid_request", f"n must be between 1 and {self.config.max_n}", status=400
            )
        shared = self.shared(request.tools)
        chat = shared.chat
        required = _required_tool(request)
        forced: tuple[int, ...] = ()
        if required is not None:
            prefix = shared.parser.forced_call_prefix(required or None)
            if prefix is None and required:
                prefix = shared.parser.forced_call_prefix(None)
            forced = _forced_ids(chat, prefix) if prefix else ()
        try:
            plan = self._plan(session, chat, messages)
        except TokenizationError as exc:
            raise GatewayError("invalid_request", str(exc), status=400) from None
        if self.vision is not None and urls:
            await self._place_images(self.vision, plan, urls)
        context = self.context_length
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
        wanted = request.max_tokens or self.config.default_max_tokens
        max_new = wanted if context is None else min(wanted, context - prompt)
        return _Prepared(shared, plan, messages, forced, required, max_new, self.vision)

    async def _complete(self, session: Session, request: ChatRequest) -> ChatResult:
        prep = await self._prepare(session, request)
        if prep.plan.segment is not None:
            prep.plan.segment.busy = True
        started = time.perf_counter()
        try:
            results = await self._generate(
                request, prep.input_ids, prep.max_new, tuple(prep.plan.urls) or None
            )
        finally:
            if prep.plan.segment is not None:
                prep.plan.segment.busy = False
        return self._finish(session, request, prep, results, time.perf_counter() - started)

    def _stream_start(
        self, prep: _Prepared, request: ChatRequest, rid: str
    ) -> tuple[TurnStream, GenerateRequest]:
        """The reader of the streamed turn and the engine request that streams it."""
        chat, parser = prep.shared.chat, prep.shared.parser
        enabled = bool(request.tools) and request.tool_choice != "none"
        turn = TurnStream(
            markers=parser.call_markers if enabled else (),
            think=("<think>", "</think>") if parser.splits_think_tags else None,
            thinking=not prep.forced and _opens_thinking(chat, prep.plan.input_ids),
            stops=tuple(request.stop),
        )
        engine_request = GenerateRequest(
            input_ids=prep.input_ids,
            sampling=self._sampling(request, prep.max_new),
            rid=rid,
            session_id=request.session,
            image_data=tuple(prep.plan.urls) or None,
        )
        return turn, engine_request

    async def _stream(
        self, session: Session, request: ChatRequest
    ) -> AsyncGenerator[StreamStart | StreamDelta | ChatResult, None]:
        """One sample, streamed from the engine (``n == 1``)."""
        prep = await self._prepare(session, request)
        chat = prep.shared.chat
        rid = f"gw-{uuid.uuid4().hex[:16]}-0"
        turn, engine_request = self._stream_start(prep, request, rid)
        deadline = anyio.current_time() + self.config.request_timeout
        segment = prep.plan.segment
        if segment is not None:
            segment.busy = True
        started = time.perf_counter()
        acquired, borrower = False, object()
        result: GenerateResult | None = None
        chunks = self.engine.generate_stream(engine_request)
        try:
            with anyio.fail_after(self.config.request_timeout):
                acquired = await self._acquire(borrower)
            head: StreamStart | None = None
            decoded = 0
            text = IncrementalText(chat.decode)
            text.extend(prep.forced)
            while result is None:
                try:
                    with anyio.fail_after(max(deadline - anyio.current_time(), 0.0)):
                        chunk = await anext(chunks)
                except StopAsyncIteration:
                    raise GatewayError(
                        "engine_error", "the engine's stream ended without a result", status=503
                    ) from None
                result = chunk.result
                if head is None:
                    head = StreamStart(
                        f"chatcmpl-{uuid.uuid4().hex}",
                        request.model or self.config.model_name,
                        int(time.time()),
                        len(prep.plan.input_ids),
                    )
                    yield head
                if result is None and len(chunk.output_ids) > decoded:
                    new = chunk.output_ids[decoded:]
                    decoded = len(chunk.output_ids)
                    for delta in turn.feed(text.extend(new)):
                        yield delta
        except TimeoutError:
            await self._abort([rid])
            raise self._timeout_error() from None
        except (anyio.get_cancelled_exc_class(), GeneratorExit):
            await self._abort([rid])  # the client went away: free the engine now
            raise
        except GatewayError:
            await self._abort([rid])
            raise
        except ToolRolloutError as exc:
            raise _engine_error(exc) from None
        finally:
            with anyio.CancelScope(shield=True):
                with contextlib.suppress(Exception):
                    await chunks.aclose()
            if acquired:
                self._limiter.release_on_behalf_of(borrower)
            if segment is not None:
                segment.busy = False
        result = _check_result(result)
        final = self._finish(
            session, request, prep, [result], time.perf_counter() - started, streamed=turn
        )
        assert head is not None  # a result comes in a chunk, after the start
        for delta in turn.last:
            yield delta
        yield dataclasses.replace(final, id=head.id, created=head.created)

    def _finish(
        self,
        session: Session,
        request: ChatRequest,
        prep: _Prepared,
        results: Sequence[GenerateResult],
        seconds: float,
        *,
        streamed: TurnStream | None = None,
    ) -> ChatResult:
        """Parse the answers, check ``tool_choice``, commit them (sync) and build the result."""
        plan = prep.plan
        enabled = bool(request.tools) and request.tool_choice != "none"
        calls_so_far = plan.segment.num_tool_calls if plan.segment is not None else 0
        choices, candidates = self._choices(
            prep.shared, results, enabled, calls_so_far, prep.forced
        )
        if prep.required is not None:
            _check_tool_choice(choices, prep.required)
        if streamed is not None:
            (choice,) = choices
            streamed.last = streamed.finish(choice.reasoning, choice.content)
            reasoning = streamed.reasoning if streamed.reasoning_sent else choice.reasoning
            choices = [dataclasses.replace(choice, content=streamed.content, reasoning=reasoning)]
            candidates[0].returned = returned_view(streamed.content, choice.tool_calls)
        segment = self._commit(session, prep.shared, plan, candidates, prep.messages)
        if segment is not None:
            segment.requests += 1
            segment.state.timing.generation_seconds += seconds
            segment.last_used = time.monotonic()
        return ChatResult(
            id=f"chatcmpl-{uuid.uuid4().hex}",
            model=request.model or self.config.model_name,
            created=int(time.time()),
            choices=tuple(choices),
            prompt_tokens=len(plan.input_ids),
            completion_tokens=sum(len(r.output_ids) for r in results),
            cached_tokens=max((r.cached_tokens for r in results), default=0),
        )

    async def _place_images(self, vision: VisionFormat, plan: _Plan, urls: dict[str, str]) -> None:
        """Prepare the images of the plan's new messages (in a worker thread) and expand
        their placeholders in its ids, as the rollout loop does for a tool's images."""
        wanted = [urls[key] for key in _image_keys(plan.new_messages)]
        prepared: list[PreparedImage] = []
        for index, url in enumerate(wanted):
            try:
                prepared.append(await anyio.to_thread.run_sync(vision.prepare, url))
            except (ImageError, ValueError, OSError) as exc:
                raise GatewayError(
                    "invalid_request", f"image {index + 1} of the request: {exc}", status=400
                ) from None
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
            raise GatewayError("invalid_request", str(exc), status=400) from None
        plan.images, plan.runs = prepared, list(runs)
        plan.urls = [*earlier, *(image.data_url for image in prepared)]

    def _plan(self, session: Session, chat: ChatFormat, messages: list[dict[str, Any]]) -> _Plan:
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
                return _Plan([*ids, *delta], segment, taken, new, delta)
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
        if len(session.segments) >= self.config.max_segments:
            raise GatewayError(
                "invalid_request",
                f"session {session.key!r} has {len(session.segments)} segments, the most "
                "--max-segments allows; close it and start a new session",
                status=400,
            )
        prompt = chat.render_prompt(messages)
        return _Plan(prompt, None, -1, messages, [], reason, parent, common)

    def _sampling(self, request: ChatRequest, max_new: int) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=max_new,
            temperature=1.0 if request.temperature is None else request.temperature,
            top_p=1.0 if request.top_p is None else request.top_p,
            top_k=-1 if request.top_k is None else request.top_k,
            stop=tuple(request.stop),
            seed=_seed(request.metadata),
        )

    def _timeout_error(self) -> GatewayError:
        return GatewayError(
            "timeout",
            f"the model did not answer within {self.config.request_timeout:g} s "
            "(--request-timeout)",
            status=504,
        )

    async def _generate(
        self,
        request: ChatRequest,
        input_ids: Sequence[int],
        max_new: int,
        image_data: tuple[str, ...] | None = None,
    ) -> list[GenerateResult]:
        """The ``n`` samples, within the limits; aborted in the engine when cancelled."""
        base = f"gw-{uuid.uuid4().hex[:16]}"
        rids = [f"{base}-{i}" for i in range(request.n)]
        sampling = self._sampling(request, max_new)
        ids = token_id_array(input_ids)  # one array shared by the n requests

        results: list[GenerateResult | None] = [None] * len(rids)

        async def one(index: int, rid: str) -> None:
            seeded = sampling
            if sampling.seed is not None:
                seeded = dataclasses.replace(sampling, seed=sampling.seed + index)
            results[index] = await self.engine.generate(
                GenerateRequest(
                    input_ids=ids,
                    sampling=seeded,
                    rid=rid,
                    session_id=request.session,
                    image_data=image_data,
                )
            )

        acquired, borrower = False, object()
        try:
            with anyio.fail_after(self.config.request_timeout):
                acquired = await self._acquire(borrower)
                if len(rids) == 1:
                    await one(0, rids[0])
                else:
                    try:
                        async with anyio.create_task_group() as samples:
                            for index, rid in enumerate(rids):
                                samples.start_soon(one, index, rid)
                    except BaseExceptionGroup as group:
                        raise _first_error(group) from None
        except TimeoutError:
            await self._abort(rids)
            raise self._timeout_error() from None
        except anyio.get_cancelled_exc_class():
            await self._abort(rids)  # the client went away: free the engine now
            raise
        except ToolRolloutError as exc:
            raise _engine_error(exc) from None
        finally:
            if acquired:
                self._limiter.release_on_behalf_of(borrower)
        return [_check_result(result) for result in results]

    async def _acquire(self, borrower: object) -> bool:
        """A generation slot for ``borrower`` (one object per request: a streamed answer is
        released by another task than the one that took it); waits in a bounded line,
        else ``overloaded`` at once."""
        try:
            self._limiter.acquire_on_behalf_of_nowait(borrower)
        except anyio.WouldBlock:
            if self._waiting >= self.config.max_waiting:
                raise GatewayError(
                    "overloaded",
                    f"the gateway has {self._waiting} requests waiting (--max-waiting); "
                    "retry later",
                    status=429,
                ) from None
            self._waiting += 1
            try:
                await self._limiter.acquire_on_behalf_of(borrower)
            finally:
                self._waiting -= 1
        return True

    async def _abort(self, rids: Sequence[str]) -> None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(5.0):
            for rid in rids:
                with contextlib.suppress(ToolRolloutError, OSError):
                    await self.engine.abort(rid)

    def _choices(
        self,
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
        self,
        session: Session,
        shared: RolloutShared,
        plan: _Plan,
        candidates: list[Candidate],
        messages: list[dict[str, Any]],
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
            self._limit_open(session)
        if len(candidates) == 1:
            segment.take(candidates[0])
        else:
            segment.pending = candidates
        return segment

    def _limit_open(self, session: Session) -> None:
        open_segments = [s for s in session.segments if s.open and not s.busy]
        while len(open_segments) > self.config.max_open_segments:
            oldest = min(open_segments, key=lambda s: s.last_used)
            oldest.open = False
            open_segments.remove(oldest)


def _transcript(
    session: Session, shared: RolloutShared, messages: list[dict[str, Any]], plan: _Plan
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


def _still_extends(segment: Segment, plan: _Plan) -> bool:
    """Whether the segment is still where the plan found it (no other answer went in)."""
    expected = len(plan.input_ids) - len(plan.delta)
    pending = segment.pending[plan.taken].ids if plan.taken >= 0 else ()
    return segment.open and segment.num_tokens + len(pending) == expected


def _checked_messages(request: ChatRequest) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The request's messages without empty fields, image parts as ``{"type": "image",
    "sha256"}`` (the template renders a placeholder; the digest tells images apart when a
    request is matched against a transcript), and the images' data URLs by digest; a
    one-line error for a bad message."""
    if not request.messages:
        raise GatewayError("invalid_request", "messages must not be empty", status=400)
    out: list[dict[str, Any]] = []
    urls: dict[str, str] = {}
    for i, message in enumerate(request.messages):
        if not isinstance(message, Mapping) or message.get("role") not in _ROLES:
            raise GatewayError(
                "invalid_request",
                f"messages[{i}]: role must be one of {', '.join(sorted(_ROLES))}",
                status=400,
            )
        cleaned = {k: v for k, v in message.items() if v is not None}
        if cleaned["role"] == "developer":
            cleaned["role"] = "system"
        if isinstance(cleaned.get("content"), list):
            cleaned["content"] = [
                _image_part(part, f"messages[{i}].content[{j}]", urls)
                for j, part in enumerate(cleaned["content"])
            ]
        out.append(cleaned)
    if out[-1]["role"] == "assistant":
        raise GatewayError(
            "invalid_request",
            "the last message is an assistant turn; continuing a prefilled assistant "
            "message is not supported",
            status=400,
        )
    return out, urls


def _image_part(part: Any, where: str, urls: dict[str, str]) -> Any:
    """An ``image_url`` part as the template's image part; other parts unchanged."""
    if not isinstance(part, Mapping) or part.get("type") not in ("image_url", "image"):
        return part
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, Mapping) else image
    if part.get("type") == "image" and "sha256" in part:
        return part  # already canonical
    if not isinstance(url, str) or not url:
        raise GatewayError("invalid_request", f"{where}: an image part needs a URL", status=400)
    if not url.startswith("data:"):
        raise GatewayError(
            "invalid_request",
            f"{where}: image URLs are not fetched (the gateway has no network access); send "
            "the image inline as a base64 data: URL",
            status=400,
        )
    key = hashlib.sha256(url.encode()).hexdigest()
    urls[key] = url
    return {"type": "image", "sha256": key}


def _image_keys(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """The digests of the image parts of ``messages``, in rendering order."""
    return [
        str(part["sha256"])
        for message in messages
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if isinstance(part, Mapping) and part.get("type") == "image" and "sha256" in part
    ]


def _no_vision() -> GatewayError:
    return GatewayError(
        "invalid_request",
        "this model takes no images (its folder has no image processor); send text",
        status=400,
    )


def _required_tool(request: ChatRequest) -> str | None:
    """What ``tool_choice`` demands: None (nothing), "" (some call) or a tool's name."""
    choice = request.tool_choice
    if choice is None or choice in ("auto", "none"):
        return None
    names = [str(t.get("function", {}).get("name", "")) for t in request.tools]
    if not names:
        raise GatewayError(
            "invalid_request",
            "tool_choice asks for a tool call but no tools were given",
            status=400,
        )
    if choice == "required":
        return ""
    name = choice.get("function", {}).get("name") if isinstance(choice, Mapping) else None
    if not isinstance(name, str) or not name:
        raise GatewayError(
            "invalid_request",
            f"tool_choice: {choice!r} is not supported (auto, none, required, a function)",
            status=400,
        )
    if name not in names:
        raise GatewayError(
            "invalid_request", f"tool_choice names {name!r}, which is not in tools", status=400
        )
    return name


def _forced_ids(chat: ChatFormat, prefix: str) -> tuple[int, ...]:
    """The ids of ``prefix`` that stay the same whatever follows it: a last token that
    would merge with the model's next characters (``": "`` + ``{"`` is one token ``' {"'``
    in Qwen's vocabulary) is left for the model, so the turn keeps the tokenization a
    fresh render of the call gives."""
    ids = chat.encode(prefix)
    keep = len(ids)
    for following in ('{"', "<", " ", "a", "\n", '"'):
        longer = chat.encode(prefix + following)
        same = 0
        while same < min(keep, len(longer)) and ids[same] == longer[same]:
            same += 1
        keep = same
    return tuple(ids[:keep])


def _check_tool_choice(choices: Sequence[ChatChoice], required: str) -> None:
    """A forced call the model did not complete is an error, never plain text."""
    for choice in choices:
        names = [call.name for call in choice.tool_calls]
        if names and (not required or all(name == required for name in names)):
            continue
        wanted = f"a call to {required!r}" if required else "a tool call"
        got = f"calls to {names}" if names else f"no parseable call ({choice.content[:200]!r})"
        raise GatewayError(
            "tool_choice_unmet",
            f"tool_choice required {wanted}, but the model produced {got}",
            status=500,
        )


def _opens_thinking(chat: ChatFormat, prompt: Sequence[int]) -> bool:
    """Whether the generation prompt ends inside an open ``<think>`` block."""
    return chat.decode(list(prompt[-8:])).rstrip().endswith("<think>")


def _engine_error(exc: ToolRolloutError) -> GatewayError:
    if isinstance(exc, OverlongPromptError):
        return GatewayError("context_length_exceeded", str(exc), status=400)
    if isinstance(exc, UserError):
        return GatewayError("invalid_request", str(exc), status=400)
    return GatewayError("engine_error", str(exc), status=503)


def _first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first error of a request's samples that is not a cancellation (the samples of
    one request fail alike: one error answers it)."""
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            return _first_error(exc)
        if not isinstance(exc, anyio.get_cancelled_exc_class()):
            return exc
    return group


def _check_result(result: GenerateResult | None) -> GenerateResult:
    if result is None:
        raise GatewayError("engine_error", "the engine returned no result", status=503)
    if result.finish_reason.type == "abort":
        raise GatewayError(
            "engine_error",
            f"the engine aborted the generation: {result.finish_reason.message or ''}",
            status=503,
        )
    if result.output_logprobs is None:
        raise GatewayError("engine_error", "the engine returned no logprobs", status=503)
    return result


def _seed(metadata: Mapping[str, Any]) -> int | None:
    seed = metadata.get("seed")
    return int(seed) if isinstance(seed, int) and not isinstance(seed, bool) else None


def _reward_value(reward: Any) -> float:
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        raise GatewayError(
            "invalid_request", f"reward must be a number, got {reward!r}", status=400
        )
    return float(reward)


def _family_name(family: Any) -> str | None:
    if family is None or isinstance(family, str):
        return family
    return str(family.name)


def _next_ordinal(folder: Path) -> int:
    """Sessions of an earlier gateway run on the same output keep their prompt indexes."""
    from toolrollout.rollout import read_shards

    if not folder.is_dir():
        return 0
    column = read_shards(folder).column("prompt_index").to_pylist()
    return max(column, default=-1) + 1
