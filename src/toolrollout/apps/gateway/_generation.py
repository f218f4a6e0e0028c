"""The gateway's calls into its engine, within its limits.

At most ``max_concurrency`` generations are in flight (a capacity limiter) and at most
``max_waiting`` requests wait for one (beyond it a request is answered ``overloaded`` at
once instead of piling up on the loop); every request is answered within
``request_timeout``, and one that timed out, or whose client went away, is aborted in the
engine at once. Engine failures become the :class:`GatewayError` the APIs answer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from toolrollout._exceptions import OverlongPromptError, ToolRolloutError, UserError
from toolrollout.engines._types import (
    GenerateRequest,
    GenerateResult,
    SamplingParams,
    StreamChunk,
    token_id_array,
)

from ._types import ChatRequest, GatewayError, invalid

if TYPE_CHECKING:
    from toolrollout.engines import Engine

    from ._types import GatewayConfig

__all__ = ["EngineCalls", "check_result"]


class EngineCalls:
    """Generation for the gateway's requests: ``n`` samples at once, or one streamed."""

    def __init__(self, engine: Engine, config: GatewayConfig) -> None:
        self.engine = engine
        self.config = config
        self._limiter = anyio.CapacityLimiter(config.max_concurrency)
        self._waiting = 0

    def sampling(self, request: ChatRequest, max_new: int) -> SamplingParams:
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

    async def generate(
        self,
        request: ChatRequest,
        input_ids: Sequence[int],
        max_new: int,
        image_data: tuple[str, ...] | None = None,
    ) -> list[GenerateResult]:
        """The ``n`` samples, within the limits; aborted in the engine when cancelled."""
        base = f"gw-{uuid.uuid4().hex[:16]}"
        rids = [f"{base}-{i}" for i in range(request.n)]
        sampling = self.sampling(request, max_new)
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
        return [check_result(result) for result in results]

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

    async def stream(
        self,
        request: ChatRequest,
        input_ids: Sequence[int],
        max_new: int,
        image_data: tuple[str, ...] | None = None,
    ) -> AsyncGenerator[StreamChunk, None]:
        """The engine's chunks of one sample (``n == 1``), the last one with its result.
        Closing the generator early (``contextlib.aclosing``) aborts the generation."""
        rid = f"gw-{uuid.uuid4().hex[:16]}-0"
        chunks = self.engine.generate_stream(
            GenerateRequest(
                input_ids=input_ids,
                sampling=self.sampling(request, max_new),
                rid=rid,
                session_id=request.session,
                image_data=image_data,
            )
        )
        deadline = anyio.current_time() + self.config.request_timeout
        acquired, borrower = False, object()
        try:
            with anyio.fail_after(self.config.request_timeout):
                acquired = await self._acquire(borrower)
            while True:
                try:
                    with anyio.fail_after(max(deadline - anyio.current_time(), 0.0)):
                        chunk = await anext(chunks)
                except StopAsyncIteration:
                    raise GatewayError(
                        "engine_error", "the engine's stream ended without a result", status=503
                    ) from None
                yield chunk
                if chunk.result is not None:
                    return
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


def _engine_error(exc: ToolRolloutError) -> GatewayError:
    if isinstance(exc, OverlongPromptError):
        return GatewayError("context_length_exceeded", str(exc), status=400)
    if isinstance(exc, UserError):
        return invalid(str(exc))
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


def check_result(result: GenerateResult | None) -> GenerateResult:
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
