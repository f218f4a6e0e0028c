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

The client is bound to one event loop and is not thread-safe. It sends over aiohttp behind
httpx's API (``toolrollout._http``: a fraction of httpx's own CPU per request). The
``transport`` argument replaces that: pass ``httpx.MockTransport(handler)`` to run without
a server, or ``httpx.AsyncHTTPTransport()`` for httpx's own.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
from yarl import URL

from ..._exceptions import (
    EngineConnectionError,
    EngineError,
    EngineRequestRejected,
    UserError,
)
from ..._http import AiohttpTransport
from ..._net import open_file_limit
from ..._pacing import pace
from .. import _wire
from .._base import Engine
from .._routing import Router, ServerStats
from .._types import FinishReason, GenerateRequest, GenerateResult
from .._wire import StreamChunk
from ._control import _ControlPlane
from ._transport import ENGINE_RETRY, RetryPolicy, _normalize_urls, _translate

__all__ = [
    "DEFAULT_LIMITS",
    "DEFAULT_TIMEOUT",
    "ClientStats",
    "SGLangClient",
    "connection_limits",
]

logger = logging.getLogger("toolrollout.engines.sglang")

DEFAULT_TIMEOUT = httpx.Timeout(600.0, connect=10.0)
"""10 s to connect; 600 s to read, since one long generation is silent until it ends."""

DEFAULT_LIMITS = httpx.Limits(max_connections=1024, max_keepalive_connections=16)
"""Enough connections for thousands of concurrent rollouts against a handful of servers.
The default transport (aiohttp, see ``toolrollout._http``) keeps every idle connection
until ``keepalive_expiry``; ``max_keepalive_connections`` applies when an httpx transport is
passed instead, whose pool scan grows with the square of the idle connections kept
(docs/benchmarks.md). A run with more requests in flight needs :func:`connection_limits`."""

CONTROL_CONNECTIONS = 64
"""Connections beside the generate requests, for the control plane (health, load, aborts)."""

FILE_RESERVE = 256
"""Descriptors left to the rest of the process (files, pipes, tool services' sockets)."""


def connection_limits(concurrency: int) -> httpx.Limits:
    """Pool limits for ``concurrency`` generate requests in flight at once.

    A request beyond the pool's size waits for a connection, unseen by the server and by
    any scheduling policy, so the composition root sizes the pool to the run's
    ``RolloutConfig.concurrency`` (plus the control plane), never below
    :data:`DEFAULT_LIMITS`.
    """
    if concurrency < 1:
        raise UserError(f"concurrency must be at least 1, got {concurrency}")
    floor = DEFAULT_LIMITS.max_connections or 0
    return httpx.Limits(
        max_connections=max(floor, concurrency + CONTROL_CONNECTIONS),
        max_keepalive_connections=DEFAULT_LIMITS.max_keepalive_connections,
        keepalive_expiry=DEFAULT_LIMITS.keepalive_expiry,
    )


def _fit_open_files(limits: httpx.Limits) -> httpx.Limits:
    """``limits`` with the open-file limit raised to hold them, or capped (and said so)
    where the hard limit is lower: a connection past it fails with "too many open files"."""
    connections = limits.max_connections
    if connections is None:
        return limits
    room = open_file_limit(connections + FILE_RESERVE) - FILE_RESERVE
    if room >= connections:
        return limits
    capped = max(room, 1)
    logger.warning(
        "SGLangClient: a pool of %d connections needs %d open files, but the limit is %d; "
        "the pool is capped at %d (raise the hard limit, `ulimit -Hn`, for more)",
        connections,
        connections + FILE_RESERVE,
        room + FILE_RESERVE,
        capped,
    )
    return httpx.Limits(
        max_connections=capped,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
    )


@dataclass(frozen=True, slots=True)
class ClientStats:
    """A snapshot of the client's counters (frozen: it does not change under you)."""

    servers: tuple[ServerStats, ...]
    total_requests: int
    """Calls made (generate, generate_batch, generate_many, stream); retries not counted."""
    in_flight: int
    """Calls still running."""
    retries: int
    """Retry attempts made after a failed attempt."""
    failures: int
    """Calls that ended in an exception (after any retries)."""
    sessions: int
    """Sessions currently pinned to a server."""
    moves: int = 0
    """Sessions moved to another server by failover."""
    max_connections: int | None = None
    """The connection pool's size (None: unbounded)."""
    pool_waits: int = 0
    """Requests sent while the pool was full, so they waited for a connection: a sign the
    pool is smaller than the run's concurrency (see :func:`connection_limits`)."""

    @property
    def outstanding(self) -> int:
        """HTTP requests in flight over all servers."""
        return sum(s.outstanding for s in self.servers)


@dataclass(slots=True)
class _InFlight:
    """What :meth:`SGLangClient.abort` needs to know about a running request."""

    rid: str
    wire_rid: str
    server: str | None = None
    aborted: bool = False


class _AbortedBeforeSend(EngineError):
    """The request was aborted before it reached a server (internal, never escapes)."""


class SGLangClient(_ControlPlane, Engine):
    """Engine backed by one or several SGLang servers over HTTP.

    Example::

        async with SGLangClient(["http://gpu0:30000", "http://gpu1:30000"]) as engine:
            await engine.wait_healthy(timeout=600)
            result = await engine.generate(GenerateRequest(input_ids=ids, session_id=traj_id))
    """

    def __init__(
        self,
        base_urls: str | Sequence[str],
        *,
        api_key: str | None = None,
        timeout: httpx.Timeout | float | None = DEFAULT_TIMEOUT,
        limits: httpx.Limits = DEFAULT_LIMITS,
        retry: RetryPolicy | None = None,
        max_sessions: int = 100_000,
        headers: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        abort_urls: Sequence[str] | None = None,
        failover_after: int | None = 3,
        failover_cooldown: float = 10.0,
    ) -> None:
        if max_sessions < 1:
            raise UserError(f"max_sessions must be >= 1, got {max_sessions}")
        if failover_after is not None and failover_after < 1:
            raise UserError(f"failover_after must be >= 1 or None, got {failover_after}")
        self._router = Router(
            _normalize_urls(base_urls),
            max_sessions=max_sessions,
            failover_after=failover_after,
            cooldown=failover_cooldown,
            clock=_loop_clock,
        )
        # sglang-router (0.3.x) answers 404 on /abort_request, so behind a router the
        # abort is sent to the workers themselves; each ignores rids it does not hold.
        self._abort_urls = _normalize_urls(abort_urls) if abort_urls else None
        self._retry = retry if retry is not None else ENGINE_RETRY
        all_headers = dict(headers or {})
        if api_key:
            all_headers["Authorization"] = f"Bearer {api_key}"
        # The default transport also serves generate's hot path without httpx's objects
        # (_request_bytes); a transport passed in is always used through httpx's API.
        if transport is None:
            limits = _fit_open_files(limits)
        self._max_connections = limits.max_connections
        self._pool_waits = 0
        self._pool_warned = False
        self._raw = AiohttpTransport(limits=limits) if transport is None else None
        self._raw_headers: list[tuple[str, str]] | None = None
        self._http = httpx.AsyncClient(
            timeout=timeout,
            limits=limits,
            headers=all_headers,
            transport=transport if transport is not None else self._raw,
        )
        self._inflight: dict[str, _InFlight] = {}
        self._urls: dict[tuple[str, str], httpx.URL] = {}
        self._raw_urls: dict[tuple[str, str], URL] = {}
        self._total = 0
        self._active = 0
        self._retries = 0
        self._failures = 0
        self._closed = False

    # ------------------------------------------------------------------ public API

    @property
    def base_urls(self) -> tuple[str, ...]:
        """The servers, normalised (no trailing slash), in the order given."""
        return self._router.urls

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Generate one sample; returns the partial output if :meth:`abort` is called."""
        _require_n(request, 1, "generate")
        with self._track([request.rid]) as entries:
            entry = entries[0]
            try:
                data, url = await self._post_json(
                    what=f"generate rid={entry.rid}",
                    session_id=request.session_id,
                    entries=entries,
                    body=lambda: _wire.generate_body(request, entry.wire_rid),
                )
            except EngineError as exc:
                if entry.aborted and not isinstance(exc, EngineRequestRejected):
                    # Aborted before it was sent, or while waiting to retry: no tokens
                    # reached the client, so the partial output is empty.
                    return _empty_abort(entry, request)
                raise
            return _wire.parse_result(
                data, rid=entry.rid, prompt_tokens_hint=len(request.input_ids), server_url=url
            )

    async def generate_batch(self, requests: Sequence[GenerateRequest]) -> list[GenerateResult]:
        """Generate one sample per request in one HTTP call; results keep the input order.

        The batch goes to one server: the one pinned to the first request that has a
        session, or the least busy one; sessions of the batch that were not pinned yet
        are pinned to it. Each item can be aborted by its ``rid`` once the batch is sent.
        """
        if not requests:
            return []
        for request in requests:
            _require_n(request, 1, "generate_batch")
        session = next((r.session_id for r in requests if r.session_id is not None), None)
        with self._track([r.rid for r in requests]) as entries:
            data, url = await self._post_json(
                what=f"generate_batch of {len(requests)}",
                session_id=session,
                entries=entries,
                body=lambda: _wire.batch_body(requests, [e.wire_rid for e in entries]),
            )
            for request in requests:
                if request.session_id is not None:
                    self._router.bind(request.session_id, url)
            return _wire.parse_results(
                data,
                rids=[e.rid for e in entries],
                prompt_tokens_hints=[len(r.input_ids) for r in requests],
                server_url=url,
                expect_ids=[e.wire_rid for e in entries],
            )

    async def generate_many(self, request: GenerateRequest) -> list[GenerateResult]:
        """Draw ``request.sampling.n`` samples of one prompt in one call (SGLang's ``n``).

        SGLang prefills the prompt once and gives every sample a fresh server-side id, so
        each result's ``rid`` is that id, and these samples cannot be aborted by ``rid``.
        """
        n = request.sampling.n
        if n < 1:
            raise UserError(f"sampling.n must be >= 1, got {n}")
        if n == 1:
            return [await self.generate(request)]
        with self._track([request.rid], register=False) as entries:
            data, url = await self._post_json(
                what=f"generate_many n={n}",
                session_id=request.session_id,
                entries=entries,
                body=lambda: _wire.generate_body(request, entries[0].wire_rid),
            )
            return _wire.parse_results(
                data,
                rids=[None] * n,
                prompt_tokens_hints=[len(request.input_ids)] * n,
                server_url=url,
            )

    async def stream(self, request: GenerateRequest) -> AsyncGenerator[StreamChunk, None]:
        """Stream one sample as cumulative :class:`StreamChunk` s; the last has ``.result``.

        Opening the stream is retried like any call; once chunks flow, a broken
        connection raises :class:`EngineConnectionError` (a stream cannot be resumed).
        Both SGLang stream modes (cumulative, and ``--incremental-streaming-output``
        deltas) are recognised. Close the iterator early (``contextlib.aclosing``) to
        stop: SGLang aborts a request whose client disconnects.
        """
        _require_n(request, 1, "stream")
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
            accumulator = _wire.StreamAccumulator(
                rid=entry.rid, prompt_tokens_hint=len(request.input_ids), server_url=url
            )
            failed = True
            try:
                async for line in response.aiter_lines():
                    payload = _wire.sse_data(line)
                    if payload is None:
                        continue
                    if payload.strip() == _wire.DONE:
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

    async def abort(self, rid: str) -> None:
        """Abort a running request on the server that holds it (unknown rids are ignored).

        The pending call returns the tokens generated so far with an ``abort`` finish
        reason. An abort is itself retried on connection errors.
        """
        self._check_open()
        entry = self._inflight.get(rid)
        if entry is None:
            logger.debug("abort(%r): no such request in flight; ignored", rid)
            return
        entry.aborted = True
        if entry.server is None:
            return  # not sent yet: the pending call returns an empty aborted result
        if self._abort_urls is not None:
            async with anyio.create_task_group() as tg:
                for url in self._abort_urls:
                    tg.start_soon(self._abort_on, url, entry.wire_rid, rid)
            return
        send = functools.partial(
            self._request_once,
            entry.server,
            "POST",
            "/abort_request",
            json_body={"rid": entry.wire_rid},
        )
        await self._retrying(f"abort rid={rid}", send)

    async def abort_all(self) -> None:
        """Abort every request this client has in flight, each by its own ``rid``.

        Only this client's own requests are named (by ``rid``), never SGLang's
        ``abort_all``, which would also stop other clients sharing the server. Used on
        shutdown; a server that cannot be reached is logged and skipped, since its
        requests end anyway when the connections close.
        """
        rids = list(self._inflight)

        async def one(rid: str) -> None:
            try:
                await self.abort(rid)
            except EngineError as exc:
                logger.warning("abort_all: could not abort %s (%s)", rid, exc)

        async with anyio.create_task_group() as tg:
            for rid in rids:
                tg.start_soon(one, rid)

    async def _abort_on(self, url: str, wire_rid: str, rid: str) -> None:
        send = functools.partial(
            self._request_once,
            url,
            "POST",
            "/abort_request",
            json_body={"rid": wire_rid},
            account=False,
        )
        await self._retrying(f"abort rid={rid} on {url}", send)

    # -- issue 20 (scheduling policies): GRPO group affinity ------------------------
    def bind_group(self, session_id: str, group: str) -> str:
        """Pin ``session_id`` to the server of ``group`` (least loaded at its first use)."""
        url = self._router.pick(f"group:{group}")
        self._router.bind(session_id, url)
        return url

    # -------------------------------------------------------------------------------
    def release_session(self, session_id: str) -> bool:
        """Unpin a finished trajectory's session; returns whether it was pinned."""
        return self._router.unbind(session_id)

    def stats(self) -> ClientStats:
        """A frozen snapshot of the counters, per server and overall."""
        return ClientStats(
            servers=self._router.stats(),
            total_requests=self._total,
            in_flight=self._active,
            retries=self._retries,
            failures=self._failures,
            sessions=self._router.session_count,
            moves=self._router.moves,
            max_connections=self._max_connections,
            pool_waits=self._pool_waits,
        )

    async def aclose(self) -> None:
        """Close the connection pool; further calls raise :class:`UserError`."""
        if not self._closed:
            self._closed = True
            await self._http.aclose()

    # ------------------------------------------------------------------ internals

    @contextlib.contextmanager
    def _track(
        self, rids: Sequence[str | None], *, register: bool = True
    ) -> Iterator[list[_InFlight]]:
        """Register a call's request ids (for abort) and count it in the stats."""
        self._check_open()
        entries = [_InFlight(rid=r, wire_rid=r) for r in (rid or uuid.uuid4().hex for rid in rids)]
        if register:
            seen: set[str] = set()
            for entry in entries:
                if entry.rid in seen or entry.rid in self._inflight:
                    raise UserError(f"request id {entry.rid!r} is already in flight")
                seen.add(entry.rid)
            for entry in entries:
                self._inflight[entry.rid] = entry
        self._total += 1
        self._active += 1
        try:
            yield entries
        except Exception:
            self._failures += 1
            raise
        finally:
            self._active -= 1
            if register:
                for entry in entries:
                    if self._inflight.get(entry.rid) is entry:
                        del self._inflight[entry.rid]

    def _attempt_target(
        self, session_id: str | None, entries: Sequence[_InFlight], avoid: set[str], number: int
    ) -> str:
        """Pick the server for attempt ``number`` and give the request ids their wire form."""
        if any(e.aborted for e in entries) and len(entries) == 1:
            raise _AbortedBeforeSend("aborted before it was sent")
        url = self._router.pick(session_id, avoid=avoid)
        for entry in entries:
            entry.server = url
            entry.wire_rid = entry.rid if number == 1 else f"{entry.rid}-retry{number - 1}"
        return url

    def _rerouter(self, session_id: str | None, avoid: set[str]) -> Callable[[str], None] | None:
        """For calls not yet pinned: steer the next attempt away from a refusing server."""
        if session_id is not None and self._router.server_of(session_id) is not None:
            return None  # a sticky session is retried on its own server

        def reroute(url: str) -> None:
            avoid.add(url)
            if session_id is not None:
                self._router.unbind(session_id)

        return reroute

    async def _post_json(
        self,
        *,
        what: str,
        session_id: str | None,
        entries: Sequence[_InFlight],
        body: Callable[[], dict[str, Any]],
    ) -> tuple[Any, str]:
        """POST /generate with retries; returns the decoded JSON and the server URL."""
        avoid: set[str] = set()
        reroute = self._rerouter(session_id, avoid)
        number = 0

        async def attempt() -> tuple[Any, str]:
            nonlocal number
            number += 1
            url = self._attempt_target(session_id, entries, avoid, number)
            content = await self._request_bytes(
                url, "/generate", body(), on_connect_failure=reroute
            )
            # The reply's decoding and the turn it starts take their turn on the loop.
            await pace()
            return _wire.parse_json(content, what=f"{what} on {url}"), url

        return await self._retrying(what, attempt, give_up=lambda: any(e.aborted for e in entries))

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


def _loop_clock() -> float:
    """The event loop's clock (virtual in tests), or the monotonic clock outside a loop."""
    try:
        return anyio.current_time()
    except RuntimeError:  # sniffio: no async library running (a stats() call from sync code)
        return time.monotonic()


def _require_n(request: GenerateRequest, n: int, method: str) -> None:
    if request.sampling.n != n:
        raise UserError(
            f"{method}() needs sampling.n == {n}, got {request.sampling.n}; "
            "use generate_many() for several samples of one prompt"
        )


def _empty_abort(entry: _InFlight, request: GenerateRequest) -> GenerateResult:
    """The result of a request aborted before any server generated a token for it."""
    return GenerateResult(
        rid=entry.rid,
        output_ids=(),
        output_logprobs=() if request.return_logprob else None,
        finish_reason=FinishReason(type="abort", message="aborted before it was sent"),
        prompt_tokens=len(request.input_ids),
        completion_tokens=0,
        server_url=entry.server,
    )
