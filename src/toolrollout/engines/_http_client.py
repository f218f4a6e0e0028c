"""The HTTP engine client SGLang's and vLLM's clients share: :class:`HTTPClient`.

Pooling, sticky sessions and failover, retries, abort by request id and the stats are
here; a subclass gives its wire format (``_generate_body``, ``_parse_generate``,
``_abort_body``, the paths) and its control plane.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from abc import abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import anyio
import httpx
from yarl import URL

from .._exceptions import EngineError, EngineRequestRejected, EngineUnavailable, UserError
from .._http import AiohttpTransport
from .._pacing import pace
from . import _wire
from ._base import Engine
from ._pool import DEFAULT_LIMITS, DEFAULT_TIMEOUT, fit_open_files
from ._routing import Router, ServerStats
from ._server_calls import ServerCalls
from ._transport import ENGINE_RETRY, RetryPolicy, _normalize_urls
from ._types import FinishReason, GenerateRequest, GenerateResult

__all__ = ["ClientStats", "HTTPClient"]

logger = logging.getLogger("toolrollout.engines")


@dataclass(frozen=True, slots=True)
class ClientStats:
    """A snapshot of the client's counters."""

    servers: tuple[ServerStats, ...]
    total_requests: int
    """Calls made (generate, stream); retries not counted."""
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
    """Requests that waited for a connection: the pool is smaller than the concurrency."""

    @property
    def outstanding(self) -> int:
        """HTTP requests in flight over all servers."""
        return sum(s.outstanding for s in self.servers)


@dataclass(slots=True)
class _InFlight:
    """What :meth:`HTTPClient.abort` needs to know about a running request."""

    rid: str
    wire_rid: str
    server: str | None = None
    aborted: bool = False


class _AbortedBeforeSend(EngineError):
    """The request was aborted before it reached a server (internal, never escapes)."""


class HTTPClient(ServerCalls, Engine):
    """An engine backed by one or several inference servers over HTTP."""

    _GENERATE_PATH: ClassVar[str]
    """Where a token-in generation request is posted."""
    _ABORT_PATH: ClassVar[str]
    """Where an abort by request id is posted."""

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
            _normalize_urls(base_urls, self._ENGINE),
            max_sessions=max_sessions,
            failover_after=failover_after,
            cooldown=failover_cooldown,
            clock=_loop_clock,
        )
        # sglang-router (0.3.x) answers 404 on /abort_request, so behind a router the
        # abort is sent to the workers themselves; each ignores rids it does not hold.
        self._abort_urls = _normalize_urls(abort_urls, self._ENGINE) if abort_urls else None
        self._retry = retry if retry is not None else ENGINE_RETRY
        all_headers = dict(headers or {})
        if api_key:
            all_headers["Authorization"] = f"Bearer {api_key}"
        # The default transport also serves generate's hot path without httpx's objects
        # (_request_bytes); a transport passed in is always used through httpx's API.
        if transport is None:
            limits = fit_open_files(limits, type(self).__name__)
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
        self._dead: dict[str, str] = {}
        """Servers no call may reach any more, with the reason (see :meth:`_mark_dead`)."""
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
                    body=lambda: self._generate_body(request, entry.wire_rid),
                )
            except EngineError as exc:
                if entry.aborted and not isinstance(exc, EngineRequestRejected):
                    # Aborted before it was sent, or while waiting to retry: no tokens
                    # reached the client, so the partial output is empty.
                    return _empty_abort(entry, request)
                raise
            return self._parse_generate(data, rid=entry.rid, request=request, server_url=url)

    async def abort(self, rid: str) -> None:
        """Abort a running request on the server that holds it (unknown rids are ignored)."""
        self._check_open()
        entry = self._inflight.get(rid)
        if entry is None:
            logger.debug("abort(%r): no such request in flight; ignored", rid)
            return
        entry.aborted = True
        if entry.server is None or entry.server in self._dead:
            return  # not sent yet: the pending call returns an empty aborted result
        if self._abort_urls is not None:
            async with anyio.create_task_group() as tg:
                for url in self._abort_urls:
                    tg.start_soon(self._abort_on, url, entry.wire_rid, rid)
            return
        body = self._abort_body(entry.wire_rid)
        await self._call(entry.server, "POST", self._ABORT_PATH, body, what=f"abort rid={rid}")

    async def abort_all(self) -> None:
        """Abort this client's requests by their own ids (never the server's abort-all,
        which would stop other clients too); an unreachable server is logged and skipped."""
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
        body = self._abort_body(wire_rid)
        what = f"abort rid={rid} on {url}"
        await self._call(url, "POST", self._ABORT_PATH, body, what=what, account=False)

    def bind_group(self, session_id: str, group: str) -> str:
        """Pin ``session_id`` to the server of ``group`` (least loaded at its first use)."""
        url = self._router.pick(f"group:{group}")
        self._router.bind(session_id, url)
        return url

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
    def _track(self, rids: Sequence[str | None]) -> Iterator[list[_InFlight]]:
        """Register a call's request ids (for abort) and count it in the stats."""
        self._check_open()
        entries = [_InFlight(rid=r, wire_rid=r) for r in (rid or uuid.uuid4().hex for rid in rids)]
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
            for entry in entries:
                if self._inflight.get(entry.rid) is entry:
                    del self._inflight[entry.rid]

    def _attempt_target(
        self, session_id: str | None, entries: Sequence[_InFlight], avoid: set[str], number: int
    ) -> str:
        """Pick the server for attempt ``number`` and give the request ids their wire form."""
        if any(e.aborted for e in entries) and len(entries) == 1:
            raise _AbortedBeforeSend("aborted before it was sent")
        url = self._router.pick(session_id, avoid=avoid | self._dead.keys())
        if url in self._dead:
            raise EngineUnavailable(self._dead[url])
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
        """POST a generation request with retries; returns the decoded JSON and the server URL."""
        avoid: set[str] = set()
        reroute = self._rerouter(session_id, avoid)
        number = 0

        async def attempt() -> tuple[Any, str]:
            nonlocal number
            number += 1
            url = self._attempt_target(session_id, entries, avoid, number)
            content = await self._request_bytes(
                url, self._GENERATE_PATH, body(), on_connect_failure=reroute
            )
            # The reply's decoding and the turn it starts take their turn on the loop.
            await pace()
            return _wire.parse_json(content, what=f"{what} on {url}"), url

        return await self._retrying(what, attempt, give_up=lambda: any(e.aborted for e in entries))

    # ------------------------------------------------------------------ wire format

    @abstractmethod
    def _generate_body(self, request: GenerateRequest, wire_rid: str) -> dict[str, Any]:
        """The JSON body of one generation request sent as ``wire_rid``."""

    @abstractmethod
    def _parse_generate(
        self, data: Any, *, rid: str, request: GenerateRequest, server_url: str
    ) -> GenerateResult:
        """The decoded answer to one generation request, as the seam's result."""

    @abstractmethod
    def _abort_body(self, wire_rid: str) -> dict[str, Any]:
        """The JSON body that aborts the request sent as ``wire_rid``."""


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
            "send one request per sample"
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
