"""Test doubles for code that drives an :class:`~toolrollout.engines._base.Engine`.

:class:`ScriptedEngine` answers each ``generate`` call with the next scripted output (or
whatever a callable returns), records every request, honours ``abort`` like SGLang does and
implements the whole control plane, so an agent loop (or a trainer's weight-sync code) can
be unit-tested without a server, GPU or tokenizer. For the HTTP clients' behaviour, pass an
``httpx.MockTransport`` as ``SGLangClient(..., transport=...)``.

Example::

    engine = ScriptedEngine([
        ScriptedOutput([151657, 198, 151658, 151645]),   # a tool call, then <|im_end|>
        [9707, 151645],                                  # plain ids work too
    ])
    result = await engine.generate(GenerateRequest(input_ids=(1, 2, 3)))
    assert list(engine.requests[0].input_ids) == [1, 2, 3]
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import os
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Sequence,
)
from dataclasses import dataclass, field

import anyio

from ._exceptions import UserError
from .engines._base import Engine
from .engines._control import EngineInfo, PauseMode, ServerInfo, ServerWeightUpdate, WeightUpdate
from .engines._types import (
    FinishReason,
    GenerateRequest,
    GenerateResult,
    SamplingParams,
    StreamChunk,
)

__all__ = ["Script", "ScriptStep", "ScriptedEngine", "ScriptedOutput"]


@dataclass(frozen=True, slots=True)
class ScriptedOutput:
    """One scripted answer; ``finish_reason`` defaults to ``stop`` on the last id, or
    ``length`` when ``max_new_tokens`` cuts the ids short."""

    output_ids: Sequence[int]
    logprobs: Sequence[float] | None = None
    """One per id; defaults to ``0.0`` each when the request asks for logprobs."""
    finish_reason: FinishReason | None = None
    text: str | None = None
    cached_tokens: int = 0
    weight_version: str | None = None
    """The result's weight version; None reports the engine's current one."""
    delay: float = 0.0
    """Seconds to wait before answering, which gives a test time to call ``abort``."""
    abort_after: int = 0
    """How many ids count as generated when the request is aborted during ``delay``."""
    token_delay: float = 0.0
    """Seconds per output id, after ``delay``: a slow decoder (an abort keeps the ids so far)."""

    def __post_init__(self) -> None:
        if self.logprobs is not None and len(self.logprobs) != len(self.output_ids):
            raise UserError(
                f"ScriptedOutput has {len(self.output_ids)} ids but {len(self.logprobs)} logprobs"
            )


ScriptStep = ScriptedOutput | Sequence[int]
"""A scripted answer, or just its token ids."""

Script = (
    Iterable[ScriptStep]
    | Callable[[GenerateRequest], ScriptStep]
    | Callable[[GenerateRequest], Awaitable[ScriptStep]]
)
"""A list (or any iterable) of answers consumed in order, or a function of the request."""


def _within_budget(
    output: ScriptedOutput, request: GenerateRequest
) -> tuple[list[int], list[float], FinishReason]:
    """The scripted ids and logprobs cut to the request's ``max_new_tokens`` (then finished
    by length, as a server does), and the finish reason the script left open."""
    ids = list(output.output_ids)
    logprobs = list(output.logprobs) if output.logprobs is not None else [0.0] * len(ids)
    finish = output.finish_reason
    limit = request.sampling.max_new_tokens
    if len(ids) > limit:
        ids, logprobs = ids[:limit], logprobs[:limit]
        finish = FinishReason(type="length", length=limit)
    if finish is None:
        finish = FinishReason(type="stop", matched=ids[-1] if ids else None)
    return ids, logprobs, finish


@dataclass(slots=True)
class _Pending:
    cancel: anyio.Event = field(default_factory=anyio.Event)


SCRIPTED_URL = "scripted://"


class ScriptedEngine(Engine):
    """An :class:`Engine` that replays scripted outputs and records what it was asked;
    the constructor's arguments are what :meth:`info` and :meth:`logprob_mismatch` answer."""

    def __init__(
        self,
        script: Script,
        *,
        context_length: int | None = None,
        vision: bool = False,
        model_path: str | None = None,
        weight_version: str = "default",
        logprob_mismatch: str | None = None,
    ) -> None:
        self._function: Callable[[GenerateRequest], object] | None = None
        self._steps: Iterator[ScriptStep] | None = None
        if callable(script):
            self._function = script
        else:
            self._steps = iter(script)
        self.requests: list[GenerateRequest] = []
        """Every request received, in arrival order."""
        self.aborted: list[str] = []
        """Every rid passed to ``abort``, in call order."""
        self._pending: dict[str, _Pending] = {}
        self._counter = itertools.count()
        self.closed = False
        self.context_length = context_length
        self.vision = vision
        self.model_path = model_path
        self.weight_version = weight_version
        self._logprob_mismatch = logprob_mismatch
        """Reported by :meth:`info` and in results whose script step names none."""
        self.weight_updates: list[WeightUpdate] = []
        """Every successful :meth:`update_weights_from_disk`, in call order."""
        self._inflight: set[str] = set()
        self._changed = anyio.Event()
        """Set (and replaced) whenever a request ends; weight updates wait on it."""
        self._paused = False
        self._gate: anyio.Event | None = None
        """Not None while new requests must wait (paused, or a weight update running)."""

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Answer with the next scripted output (truncated to ``max_new_tokens``)."""
        async with self._admitted(request, "generate") as rid:
            return await self._answer(request, rid)

    @contextlib.asynccontextmanager
    async def _admitted(self, request: GenerateRequest, method: str) -> AsyncIterator[str]:
        """Wait out a pause, record ``request`` and hold its rid in flight."""
        if request.sampling.n != 1:
            raise UserError(f"{method}() needs sampling.n == 1, got {request.sampling.n}")
        while (gate := self._gate) is not None:
            await gate.wait()
        self.requests.append(request)
        rid = request.rid or f"scripted-{next(self._counter)}"
        self._inflight.add(rid)
        try:
            yield rid
        finally:
            self._pending.pop(rid, None)
            self._inflight.discard(rid)
            self._changed.set()
            self._changed = anyio.Event()

    async def _answer(self, request: GenerateRequest, rid: str) -> GenerateResult:
        output = await self._next_output(request)
        ids, logprobs, finish = _within_budget(output, request)

        if output.delay > 0 or output.token_delay > 0:
            pending = _Pending()
            self._pending[rid] = pending
            started = anyio.current_time()
            try:
                with anyio.move_on_after(output.delay + output.token_delay * len(ids)):
                    await pending.cancel.wait()
            finally:
                del self._pending[rid]
            if pending.cancel.is_set():
                keep = min(output.abort_after, len(ids))
                if output.token_delay > 0:
                    elapsed = anyio.current_time() - started - output.delay
                    keep = max(0, min(len(ids), int(elapsed / output.token_delay)))
                ids, logprobs = ids[:keep], logprobs[:keep]
                finish = FinishReason(type="abort", message="Aborted")
            elif self._paused:
                # retract / in_place: the request is kept and finishes after the pause.
                while (gate := self._gate) is not None:
                    await gate.wait()
        return self._result(request, rid, output, ids, logprobs, finish)

    def _result(
        self,
        request: GenerateRequest,
        rid: str,
        output: ScriptedOutput,
        ids: Sequence[int],
        logprobs: Sequence[float],
        finish: FinishReason,
    ) -> GenerateResult:
        return GenerateResult(
            rid=rid,
            output_ids=tuple(ids),
            output_logprobs=tuple(logprobs) if request.return_logprob else None,
            finish_reason=finish,
            prompt_tokens=len(request.input_ids),
            completion_tokens=len(ids),
            cached_tokens=output.cached_tokens,
            weight_version=(
                output.weight_version if output.weight_version is not None else self.weight_version
            ),
            text=output.text,
            server_url=SCRIPTED_URL,
        )

    async def generate_stream(self, request: GenerateRequest) -> AsyncGenerator[StreamChunk, None]:
        """Stream the next scripted output: one chunk per id, ``token_delay`` apart."""
        async with self._admitted(request, "generate_stream") as rid:
            pending = self._pending[rid] = _Pending()
            output = await self._next_output(request)
            ids, logprobs, finish = _within_budget(output, request)
            if output.delay > 0:
                with anyio.move_on_after(output.delay):
                    await pending.cancel.wait()
            done = sent = 0
            while done < len(ids) and not pending.cancel.is_set():
                if output.token_delay > 0:
                    with anyio.move_on_after(output.token_delay):
                        await pending.cancel.wait()
                    if pending.cancel.is_set():
                        break
                done += 1
                if done < len(ids):
                    yield StreamChunk(
                        rid=rid,
                        output_ids=tuple(ids[:done]),
                        output_logprobs=tuple(logprobs[:done]) if request.return_logprob else None,
                        new_ids=tuple(ids[sent:done]),
                        text=None,
                    )
                    sent = done
            if pending.cancel.is_set():
                ids, logprobs = ids[:done], logprobs[:done]
                finish = FinishReason(type="abort", message="Aborted")
            result = self._result(request, rid, output, ids, logprobs, finish)
            yield StreamChunk.final(result, before=min(sent, len(ids)))

    async def abort(self, rid: str) -> None:
        """Record the abort; a pending ``generate`` with a ``delay`` returns early."""
        self.aborted.append(rid)
        pending = self._pending.get(rid)
        if pending is not None:
            pending.cancel.set()

    async def abort_all(self) -> None:
        """Abort every request in flight (each rid is recorded in :attr:`aborted`)."""
        for rid in sorted(self._inflight):
            await self.abort(rid)

    async def logprob_mismatch(self, sampling: SamplingParams) -> str | None:
        return self._logprob_mismatch

    async def info(self) -> EngineInfo:
        """What the constructor was given, with the current weight version."""
        server = ServerInfo(
            url=SCRIPTED_URL,
            model_path=self.model_path,
            weight_version=self.weight_version,
            context_length=self.context_length,
            vision=self.vision,
            engine="scripted",
        )
        return EngineInfo.merge((server,))

    @property
    def paused(self) -> bool:
        """Whether :meth:`pause_generation` is in effect."""
        return self._paused

    @property
    def in_flight(self) -> frozenset[str]:
        """The rids of the ``generate`` calls running now (past any pause)."""
        return frozenset(self._inflight)

    async def pause_generation(self, mode: PauseMode = "abort") -> None:
        """New requests wait; ``abort`` also aborts the requests in flight, the other modes
        keep them until :meth:`continue_generation`."""
        self._check_pause_mode(mode)
        self._paused = True
        if self._gate is None:
            self._gate = anyio.Event()
        if mode == "abort":
            for rid in sorted(self._inflight):
                pending = self._pending.get(rid)
                if pending is not None:
                    pending.cancel.set()

    async def continue_generation(self) -> None:
        """Undo :meth:`pause_generation`: kept and waiting requests go on."""
        self._paused = False
        self._open_gate()

    async def update_weights_from_disk(
        self,
        model_path: str | os.PathLike[str],
        *,
        weight_version: str | None = None,
        abort_all_requests: bool = False,
    ) -> WeightUpdate:
        """Record the update; later results carry ``weight_version`` (when given). As on a
        real engine, new requests wait and those in flight finish first."""
        path = os.fspath(model_path)
        if not path:
            raise UserError("update_weights_from_disk needs a model path")
        if self._gate is None:
            self._gate = anyio.Event()
        try:
            if abort_all_requests:
                for rid in sorted(self._inflight):
                    pending = self._pending.get(rid)
                    if pending is not None:
                        pending.cancel.set()
            paused = len(self._inflight) if self._paused else 0
            while self._inflight and not self._paused:
                await self._changed.wait()
            self.model_path = path
            if weight_version is not None:
                self.weight_version = weight_version
        finally:
            if not self._paused:
                self._open_gate()
        answer = ServerWeightUpdate(
            url=SCRIPTED_URL,
            message="Succeeded to update model weights.",
            num_paused_requests=paused,
        )
        update = WeightUpdate(model_path=path, weight_version=weight_version, servers=(answer,))
        self.weight_updates.append(update)
        return update

    async def flush_cache(self) -> bool:
        """True when idle; False (nothing flushed) while requests are in flight."""
        return not self._inflight

    def _open_gate(self) -> None:
        gate, self._gate = self._gate, None
        if gate is not None:
            gate.set()

    async def aclose(self) -> None:
        self.closed = True

    async def _next_output(self, request: GenerateRequest) -> ScriptedOutput:
        step: object
        if self._function is not None:
            step = self._function(request)
            if inspect.isawaitable(step):
                step = await step
        else:
            assert self._steps is not None
            try:
                step = next(self._steps)
            except StopIteration:
                raise UserError(
                    f"ScriptedEngine ran out of scripted outputs at request "
                    f"#{len(self.requests)} (rid={request.rid!r})"
                ) from None
        if isinstance(step, ScriptedOutput):
            return step
        if isinstance(step, Sequence) and not isinstance(step, str | bytes):
            return ScriptedOutput(output_ids=tuple(int(i) for i in step))
        raise UserError(f"a script step must be a ScriptedOutput or token ids, got {step!r}")
