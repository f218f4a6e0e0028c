"""Test doubles for code that drives an :class:`~toolrollout.engines._base.Engine`.

This module is the supported test seam for rollout code: :class:`ScriptedEngine` answers
each ``generate`` call with the next scripted output (or whatever a callable returns),
records every request it receives, and honours ``abort`` like SGLang does (the pending
call returns the tokens produced so far with an ``abort`` finish reason). No server, GPU
or tokenizer is involved, so an agent loop can be unit-tested in milliseconds.

To test HTTP-level behaviour of the SGLang client instead, pass an
``httpx.MockTransport`` as ``SGLangClient(..., transport=...)``.

Example::

    engine = ScriptedEngine([
        ScriptedOutput([151657, 198, 151658, 151645]),   # a tool call, then <|im_end|>
        [9707, 151645],                                  # plain ids work too
    ])
    result = await engine.generate(GenerateRequest(input_ids=(1, 2, 3)))
    assert engine.requests[0].input_ids == (1, 2, 3)
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import anyio

from ._exceptions import UserError
from .engines._base import Engine
from .engines._types import FinishReason, GenerateRequest, GenerateResult

__all__ = ["Script", "ScriptStep", "ScriptedEngine", "ScriptedOutput"]


@dataclass(frozen=True, slots=True)
class ScriptedOutput:
    """One scripted answer.

    ``finish_reason`` defaults to ``stop`` on the last id (the way SGLang reports an
    EOS), or ``length`` when ``max_new_tokens`` cuts the ids short.
    """

    output_ids: Sequence[int]
    logprobs: Sequence[float] | None = None
    """One per id; defaults to ``0.0`` each when the request asks for logprobs."""
    finish_reason: FinishReason | None = None
    text: str | None = None
    cached_tokens: int = 0
    weight_version: str = "default"
    delay: float = 0.0
    """Seconds to wait before answering, which gives a test time to call ``abort``."""
    abort_after: int = 0
    """How many ids count as generated when the request is aborted during ``delay``."""

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


@dataclass(slots=True)
class _Pending:
    cancel: anyio.Event = field(default_factory=anyio.Event)


class ScriptedEngine(Engine):
    """An :class:`Engine` that replays scripted outputs and records what it was asked."""

    def __init__(self, script: Script) -> None:
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

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Answer with the next scripted output (truncated to ``max_new_tokens``)."""
        if request.sampling.n != 1:
            raise UserError(f"generate() needs sampling.n == 1, got {request.sampling.n}")
        self.requests.append(request)
        rid = request.rid or f"scripted-{next(self._counter)}"
        output = await self._next_output(request)
        ids = list(output.output_ids)
        logprobs = list(output.logprobs) if output.logprobs is not None else [0.0] * len(ids)
        finish = output.finish_reason
        limit = request.sampling.max_new_tokens
        if len(ids) > limit:
            ids, logprobs = ids[:limit], logprobs[:limit]
            finish = FinishReason(type="length", length=limit)
        if finish is None:
            finish = FinishReason(type="stop", matched=ids[-1] if ids else None)

        if output.delay > 0:
            pending = _Pending()
            self._pending[rid] = pending
            try:
                with anyio.move_on_after(output.delay):
                    await pending.cancel.wait()
            finally:
                del self._pending[rid]
            if pending.cancel.is_set():
                keep = min(output.abort_after, len(ids))
                ids, logprobs = ids[:keep], logprobs[:keep]
                finish = FinishReason(type="abort", message="Aborted")

        return GenerateResult(
            rid=rid,
            output_ids=tuple(ids),
            output_logprobs=tuple(logprobs) if request.return_logprob else None,
            finish_reason=finish,
            prompt_tokens=len(request.input_ids),
            completion_tokens=len(ids),
            cached_tokens=output.cached_tokens,
            weight_version=output.weight_version,
            text=output.text,
            server_url="scripted://",
        )

    async def abort(self, rid: str) -> None:
        """Record the abort; a pending ``generate`` with a ``delay`` returns early."""
        self.aborted.append(rid)
        pending = self._pending.get(rid)
        if pending is not None:
            pending.cancel.set()

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
