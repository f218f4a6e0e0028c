"""The async HTTP client for SGLang's native token-in/token-out API: :class:`SGLangClient`.

``POST /generate`` with ``input_ids`` and ``return_logprob``, so the trainer gets exactly
the ids and logprobs the server sampled. The machinery (pool, sticky routing and failover,
retries, abort by id) is :class:`HTTPClient`'s; this module is SGLang's wire format and its
batch, ``n`` and streaming calls. A retry uses the request id ``"<rid>-retry<k>"``, because
SGLang rejects a duplicate id while the first attempt may still be registered; an abort
that arrives before the request is registered is silently ignored by SGLang.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import anyio
import httpx

from ..._exceptions import EngineConnectionError, EngineError, EngineRequestRejected
from .. import _stream, _wire
from .._http_client import ClientStats, _empty_abort, _InFlight, _require_n
from .._pool import DEFAULT_LIMITS, DEFAULT_TIMEOUT, connection_limits
from .._transport import _translate
from .._types import GenerateRequest, GenerateResult, StreamChunk
from ._control import _ControlPlane

__all__ = [
    "DEFAULT_LIMITS",
    "DEFAULT_TIMEOUT",
    "ClientStats",
    "SGLangClient",
    "connection_limits",
]


class SGLangClient(_ControlPlane):
    """Engine backed by one or several SGLang servers over HTTP."""

    _GENERATE_PATH = "/generate"
    _ABORT_PATH = "/abort_request"

    def _generate_body(self, request: GenerateRequest, wire_rid: str) -> dict[str, Any]:
        return _wire.generate_body(request, wire_rid)

    def _parse_generate(
        self, data: Any, *, rid: str, request: GenerateRequest, server_url: str
    ) -> GenerateResult:
        return _wire.parse_result(
            data, rid=rid, prompt_tokens_hint=len(request.input_ids), server_url=server_url
        )

    def _abort_body(self, wire_rid: str) -> dict[str, Any]:
        return {"rid": wire_rid}

    async def _before_seeded(self, request: GenerateRequest) -> None:
        if self._seed_checked or request.sampling.seed is None:
            return
        # The requests that arrive during the check wait behind it in arrival order (the
        # lock is first in, first out), so the check does not reorder what the servers see.
        lock = self.__dict__.setdefault("_seed_lock", anyio.Lock())
        async with lock:
            await self._check_seed_honoured()

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """One sample (see :class:`~toolrollout.engines.Engine`); the first seeded request
        of a client logs the servers that ignore ``sampling_seed``."""
        await self._before_seeded(request)
        return await super().generate(request)

    async def stream(self, request: GenerateRequest) -> AsyncGenerator[StreamChunk, None]:
        """Stream one sample as cumulative :class:`StreamChunk` s; the last has ``.result``.

        Opening it is retried; once chunks flow, a broken connection raises
        :class:`EngineConnectionError`. Closing it early aborts the request on SGLang.
        """
        _require_n(request, 1, "stream")
        await self._before_seeded(request)
        with self._track([request.rid]) as entries:
            entry = entries[0]
            try:
                response, url = await self._open_stream(request, entry)
            except EngineError as exc:
                if entry.aborted and not isinstance(exc, EngineRequestRejected):
                    yield StreamChunk.final(_empty_abort(entry, request))
                    return
                raise
            accumulator = _stream.StreamAccumulator(
                rid=entry.rid, prompt_tokens_hint=len(request.input_ids), server_url=url
            )
            failed = True
            try:
                async for line in response.aiter_lines():
                    payload = _stream.sse_data(line)
                    if payload is None:
                        continue
                    if payload.strip() == _stream.DONE:
                        break
                    data = _wire.parse_json(payload.encode(), what=f"stream from {url}")
                    yield accumulator.add(data)
                if not accumulator.finished:
                    raise EngineConnectionError(
                        f"the stream from {url} ended before its last chunk"
                    )
                failed = False
            except (httpx.HTTPError, httpx.StreamError) as exc:
                raise _translate(exc, url=url) from exc
            finally:
                await response.aclose()
                self._router.release(url, failed=failed)

    def generate_stream(self, request: GenerateRequest) -> AsyncGenerator[StreamChunk, None]:
        """The engine seam's token stream: :meth:`stream` (SGLang's ``/generate`` with
        ``stream: true``); the final chunk's result is what :meth:`generate` returns."""
        return self.stream(request)

    async def _open_stream(
        self, request: GenerateRequest, entry: _InFlight
    ) -> tuple[httpx.Response, str]:
        avoid: set[str] = set()
        reroute = self._rerouter(request.session_id, avoid)
        number = 0

        async def attempt() -> tuple[httpx.Response, str]:
            nonlocal number
            number += 1
            url = self._attempt_target(request.session_id, [entry], avoid, number)
            body = _wire.generate_body(request, entry.wire_rid, stream=True)
            response = await self._request_once(
                url, "POST", "/generate", json_body=body, stream=True, on_connect_failure=reroute
            )
            return response, url

        return await self._retrying(
            f"stream rid={entry.rid}", attempt, give_up=lambda: entry.aborted
        )
