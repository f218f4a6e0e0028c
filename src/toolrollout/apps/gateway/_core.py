"""The gateway core: one :class:`ChatRequest` in, one :class:`ChatResult` out, recorded.

:class:`Gateway` holds the engine, the chat formats (one per tool set), the open sessions
and the writer; the request checks (``_checks.py``), the session matching and records
(``_plan.py``) and the engine's limits (``_generation.py``) live behind
:meth:`Gateway.complete` and :meth:`Gateway.stream`. A segment is the rollout loop's
transcript (:class:`~toolrollout.rollout._state.TrajectoryState`): model turns, template
deltas, drift checkpoints and the frozen row are the loop's code, not a copy.

One event loop serves every session, in structured tasks; planning a request and committing
its answer are synchronous sections, so sessions need no lock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import time
import uuid
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import anyio

from toolrollout._exceptions import ToolRolloutError, UserError
from toolrollout._records import Trajectory
from toolrollout.chat import ChatFormat
from toolrollout.chat.parsers import get_tool_parser
from toolrollout.engines._limiter import OrderedLimiter
from toolrollout.engines._types import GenerateResult
from toolrollout.rollout._config import RolloutConfig
from toolrollout.rollout._types import RolloutShared
from toolrollout.tools import ToolExecutor

from ._checks import checked_messages, no_vision, reward_value
from ._generation import EngineCalls, check_result
from ._plan import Plan, Prepared, finish, generating, place_images, prepare
from ._session import Session, freeze_segment, tools_key
from ._stream import IncrementalText
from ._types import (
    ChatRequest,
    ChatResult,
    GatewayConfig,
    GatewayError,
    StreamDelta,
    StreamStart,
    invalid,
)

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from toolrollout.chat import VisionFormat
    from toolrollout.engines import Engine
    from toolrollout.rollout import ShardWriter
    from toolrollout.spec import RunSpec

__all__ = ["Gateway"]


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
        self._calls = EngineCalls(engine, self.config)
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
        """The gateway of ``spec``'s engine (started and closed with the block) and model,
        as ``generate`` builds its run; ``spec.config`` gives the family, the tool parser
        and the template kwargs when ``config`` does not."""
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
        if self.out is not None and self.out.exists():
            raise UserError(
                f"{self.out} exists already; the gateway writes a new file (choose "
                "another --out, or move it away)"
            )
        self._entered = True
        if self.out is not None:
            from toolrollout.rollout import ShardWriter

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
            raise invalid(
                f"no open session {session!r}: rewards attach before the session is closed",
                status=404,
            )
        value = reward_value(reward)
        if segment is None:
            found.reward = value
            return
        for item in found.segments:
            if item.index == segment:
                item.reward = value
                return
        raise invalid(f"session {session!r} has no segment {segment}", status=404)

    def close_session(self, session: str, reward: float | None = None) -> list[Trajectory]:
        """End a session: its segments with a model turn become rows (written with ``out``)."""
        found = self._sessions.pop(session, None)
        if found is None:
            raise invalid(f"no open session {session!r}", status=404)
        if reward is not None:
            found.reward = reward_value(reward)
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
        tokens are decoded, :class:`StreamDelta` s as they become safe to show, and the
        :class:`ChatResult`, recorded as :meth:`complete` records it. Errors before the start
        raise from the first ``__anext__``; closing the iterator early aborts the generation
        and records nothing. With ``n > 1`` everything comes when every sample is done.
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
        messages, urls = checked_messages(request)
        if urls and self.vision is None:
            raise no_vision()
        try:
            ids = self.chat_format(request.tools).render_prompt(messages)
        except ToolRolloutError as exc:
            raise invalid(str(exc)) from None
        if self.vision is None or not urls:
            return len(ids)
        plan = Plan(ids, None, -1, messages, [])
        await place_images(self.vision, plan, urls)
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

    async def _prepare(self, session: Session, request: ChatRequest) -> Prepared:
        return await prepare(
            session,
            request,
            self.shared(request.tools),
            config=self.config,
            context_length=self.context_length,
            vision=self.vision,
        )

    async def _complete(self, session: Session, request: ChatRequest) -> ChatResult:
        prep = await self._prepare(session, request)
        started = time.perf_counter()
        with generating(prep.plan):
            results = await self._calls.generate(
                request, prep.input_ids, prep.max_new, tuple(prep.plan.urls) or None
            )
        seconds = time.perf_counter() - started
        return finish(session, request, prep, results, seconds, config=self.config)

    async def _stream(
        self, session: Session, request: ChatRequest
    ) -> AsyncGenerator[StreamStart | StreamDelta | ChatResult, None]:
        """One sample, streamed from the engine (``n == 1``)."""
        prep = await self._prepare(session, request)
        turn = prep.turn_stream(request)
        started = time.perf_counter()
        result: GenerateResult | None = None
        head: StreamStart | None = None
        chunks = self._calls.stream(
            request, prep.input_ids, prep.max_new, tuple(prep.plan.urls) or None
        )
        with generating(prep.plan):
            async with contextlib.aclosing(chunks):
                decoded = 0
                text = IncrementalText(prep.shared.chat.decode)
                text.extend(prep.forced)
                async for chunk in chunks:
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
        results = [check_result(result)]
        seconds = time.perf_counter() - started
        final = finish(session, request, prep, results, seconds, config=self.config, streamed=turn)
        assert head is not None  # a result comes in a chunk, after the start
        for delta in turn.last:
            yield delta
        yield dataclasses.replace(final, id=head.id, created=head.created)


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
