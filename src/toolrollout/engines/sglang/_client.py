"""The async HTTP client for SGLang's native token-in/token-out API.

:class:`SGLangClient` talks to one or several SGLang servers through a single pooled
``httpx.AsyncClient`` and turns every answer into the typed values of
:mod:`toolrollout.engines._types`. What it does, and why:

* **Token-in/token-out.** ``POST /generate`` with ``input_ids`` and ``return_logprob``, so
  the trainer gets exactly the ids and logprobs the server sampled (no re-tokenisation).
* **Retries** (``tenacity``, exponential backoff with jitter, bounded by
  :class:`RetryPolicy`) on connection errors, 5xx and 429, and on read timeouts only if
  asked (a read timeout usually means a long generation, and a retry doubles the load).
  Other 4xx answers are the request's fault and raise :class:`EngineRequestRejected`
  (:class:`OverlongPromptError` when SGLang says the prompt does not fit) at once. When
  the budget is spent the call raises :class:`EngineUnavailable`, chained to the last
  error. A retry uses the request id ``"<rid>-retry<k>"``, because SGLang rejects a
  duplicate id while the first attempt may still be registered on the server.
* **Routing.** All requests of one ``session_id`` go to the same server (its prefix cache
  holds the shared prompt); a new session goes to the least busy server (see
  :mod:`._routing`). A new session whose server refuses the connection moves to another
  server; a pinned session is retried on its own server until that server has failed
  ``failover_after`` attempts in a row, and then moves to a healthy one (failover; every
  request carries its full ``input_ids``, so only the prefix cache is lost). The session
  map is an LRU bounded by ``max_sessions``.
* **Retry budget.** The default :data:`ENGINE_RETRY` retries for up to 60 s from the first
  failure (at most 30 attempts), enough to ride out a worker or router restart.
* **Abort.** :meth:`abort` posts ``/abort_request`` to the server holding the request; the
  pending :meth:`generate` then returns the partial output with ``finish_reason.type ==
  "abort"`` (SGLang answers HTTP 200). SGLang silently ignores an abort that arrives
  before the request is registered on the server, so a very early abort can be lost.
* **Errors.** Every httpx exception is translated at this boundary (``raise ... from``);
  a malformed body raises :class:`EngineError` naming what is wrong.

The machinery (pool, routing, retries, abort by id) is ``engines._http_client``'s, shared
with the vLLM client; this module is SGLang's wire format and its batch, ``n`` and
streaming calls. The client is bound to one event loop and is not thread-safe. It sends
over aiohttp behind httpx's API (``toolrollout._http``: a fraction of httpx's own CPU per
request). The ``transport`` argument replaces that: pass ``httpx.MockTransport(handler)``
to run without a server, or ``httpx.AsyncHTTPTransport()`` for httpx's own.
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
    """Engine backed by one or several SGLang servers over HTTP.

    Example::

        async with SGLangClient(["http://gpu0:30000", "http://gpu1:30000"]) as engine:
            await engine.wait_healthy(timeout=600)
            result = await engine.generate(GenerateRequest(input_ids=ids, session_id=traj_id))
    """

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

        Opening the stream is retried like any call; once chunks flow, a broken
        connection raises :class:`EngineConnectionError` (a stream cannot be resumed).
        Both SGLang stream modes (cumulative, and ``--incremental-streaming-output``
        deltas) are recognised. Close the iterator early (``contextlib.aclosing``) to
        stop: SGLang aborts a request whose client disconnects.
        """
        _require_n(request, 1, "stream")
        await self._before_seeded(request)
        with self._track([request.rid]) as entries:
            entry = entries[0]
            try:
                response, url = await self._open_stream(request, entry)
            except EngineError as exc:
                if entry.aborted and not isinstance(exc, EngineRequestRejected):
                    result = _empty_abort(entry, request)
                    yield StreamChunk(
                        rid=entry.rid,
                        output_ids=(),
                        output_logprobs=result.output_logprobs,
                        new_ids=(),
                        text=None,
                        result=result,
                    )
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
