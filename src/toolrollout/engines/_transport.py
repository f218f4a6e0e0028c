"""Retry and transport plumbing of the HTTP engines (SGLang's and vLLM's clients).

One HTTP exchange (:meth:`_Transport._request_once`: load accounting, httpx errors
translated) and the retry loop around it (:meth:`_Transport._retrying`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar, TypeVar

import anyio
import httpx
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    RetryError,
    retry_if_exception,
)
from yarl import URL

from .._exceptions import (
    EngineConnectionError,
    EngineError,
    EngineHTTPError,
    EngineRequestRejected,
    EngineTimeout,
    EngineUnavailable,
    UserError,
)
from .._http import AiohttpTransport, SentOnceBody
from .._retry import ENGINE_RETRY, RetryPolicy, retry_after_first
from . import _wire
from ._routing import Router

__all__ = ["ENGINE_RETRY", "RetryPolicy"]

logger = logging.getLogger("toolrollout.engines")

_JSON_HEADERS = {"Content-Type": "application/json"}


def _body(json_body: Any) -> dict[str, Any]:
    """``build_request`` arguments for a JSON body written by orjson (none for ``None``)."""
    if json_body is None:
        return {}
    content = json_body if isinstance(json_body, bytes) else _wire.encode_json(json_body)
    return {"content": content, "headers": _JSON_HEADERS}


T = TypeVar("T")


def _normalize_urls(base_urls: str | Sequence[str], engine: str = "SGLang") -> list[str]:
    raw = [base_urls] if isinstance(base_urls, str) else list(base_urls)
    if not raw:
        raise UserError(f"{engine}Client needs at least one base URL")
    urls: list[str] = []
    for item in raw:
        url = str(item).strip().rstrip("/")
        try:
            parsed = httpx.URL(url)
        except httpx.InvalidURL as exc:
            raise UserError(f"invalid {engine} base URL {item!r}: {exc}") from exc
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise UserError(f"invalid {engine} base URL {item!r}: expected http(s)://host:port")
        if url in urls:
            raise UserError(f"duplicate {engine} base URL {url!r}")
        urls.append(url)
    return urls


def _is_connect_failure(exc: BaseException) -> bool:
    return isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)


def _translate(exc: Exception, *, url: str) -> EngineError:
    """Map an httpx exception onto the toolrollout tree (most specific first)."""
    detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if _is_connect_failure(exc):
        return EngineConnectionError(f"could not connect to {url} ({detail})")
    if isinstance(exc, httpx.TimeoutException):
        return EngineTimeout(f"no answer from {url} within the timeout ({detail})")
    if isinstance(exc, httpx.TransportError):
        return EngineConnectionError(f"the connection to {url} failed ({detail})")
    return EngineError(f"the request to {url} failed ({detail})")


async def _read_body(response: httpx.Response) -> bytes:
    """The body of an error response, even when it was opened as a stream."""
    try:
        return await response.aread()
    except httpx.HTTPError:
        return b""


class _Budget:
    """The stop and wait of one call: attempts, and seconds since its first failure.

    Time is the event loop's clock; the wait before the last attempt is cut to end at the
    budget, so that attempt still runs.
    """

    __slots__ = ("_first_failure", "_policy")

    def __init__(self, policy: RetryPolicy) -> None:
        self._policy = policy
        self._first_failure: float | None = None

    def _elapsed(self) -> float:
        now = anyio.current_time()
        if self._first_failure is None:
            self._first_failure = now
        return now - self._first_failure

    def spent(self, state: RetryCallState) -> bool:
        elapsed = self._elapsed()  # the first call marks the first failure
        if state.attempt_number >= self._policy.max_attempts:
            return True
        budget = self._policy.budget_s
        return budget is not None and elapsed >= budget

    def wait(self, state: RetryCallState) -> float:
        wait = self._policy.backoff(state.attempt_number)
        budget = self._policy.budget_s
        if budget is None:
            return wait
        return max(0.0, min(wait, budget - self._elapsed()))

    def left(self) -> str:
        budget = self._policy.budget_s
        if budget is None or self._first_failure is None:
            return ""
        return f" ({max(budget - self._elapsed(), 0.0):.1f} s of the {budget:g} s budget left)"

    def describe(self) -> str:
        if self._first_failure is None:
            return ""
        return f" in {self._elapsed():.1f} s"


class _Transport:
    """Sending with load accounting, error translation and retries (a mixin of the client)."""

    _ENGINE: ClassVar[str] = "SGLang"
    """The server's name in errors and messages."""

    _router: Router
    _http: httpx.AsyncClient
    _raw: AiohttpTransport | None
    """The default transport, for :meth:`_request_bytes` (None: a transport was passed)."""
    _raw_headers: list[tuple[str, str]] | None
    _retry: RetryPolicy
    _urls: dict[tuple[str, str], httpx.URL]
    _raw_urls: dict[tuple[str, str], URL]
    _retries: int
    _closed: bool
    _max_connections: int | None
    """The connection pool's size (None: unbounded)."""
    _pool_waits: int
    _pool_warned: bool

    def _acquire(self, url: str) -> None:
        """Count a request as sent to ``url``; a request past the pool's size is counted and,
        the first time, logged, since it waits for a connection without any other sign."""
        self._router.acquire(url)
        cap = self._max_connections
        if cap is not None and self._router.outstanding > cap:
            self._pool_waits += 1
            if not self._pool_warned:
                self._pool_warned = True
                logger.warning(
                    "%s: more than %d requests in flight fill its connection pool; "
                    "the rest wait for a free connection (ClientStats.pool_waits counts them). "
                    "Size the pool to the run: limits=connection_limits(concurrency)",
                    type(self).__name__,
                    cap,
                )

    def _check_open(self) -> None:
        if self._closed:
            raise UserError(f"this {type(self).__name__} is closed")

    def _retryable(self, exc: BaseException) -> bool:
        if isinstance(exc, EngineRequestRejected):
            return False
        if isinstance(exc, EngineHTTPError):
            return exc.status_code == 429 or exc.status_code >= 500
        if isinstance(exc, EngineTimeout):
            if isinstance(exc.__cause__, httpx.ReadTimeout):
                return self._retry.retry_timeouts
            return True
        if isinstance(exc, EngineConnectionError):
            return not isinstance(exc.__cause__, httpx.UnsupportedProtocol)
        return False

    async def _sleep(self, seconds: float) -> None:
        """The backoff sleep (an attribute so that tests can record the waits)."""
        await anyio.sleep(seconds)

    async def _retrying(
        self,
        what: str,
        attempt: Callable[[], Awaitable[T]],
        *,
        give_up: Callable[[], bool] | None = None,
    ) -> T:
        """Run ``attempt`` under the retry policy; EngineUnavailable once it is spent."""
        policy = self._retry

        def should_retry(exc: BaseException) -> bool:
            return not (give_up is not None and give_up()) and self._retryable(exc)

        def before_sleep(state: RetryCallState) -> None:
            self._retries += 1
            exc = state.outcome.exception() if state.outcome is not None else None
            wait = state.upcoming_sleep
            logger.warning(
                "%s: attempt %d/%d failed (%s); retrying in %.2f s%s",
                what,
                state.attempt_number,
                policy.max_attempts,
                exc,
                wait,
                budget.left(),
            )

        budget = _Budget(policy)
        try:
            return await retry_after_first(
                attempt,
                should_retry,
                lambda: AsyncRetrying(
                    stop=budget.spent,
                    wait=budget.wait,
                    retry=retry_if_exception(should_retry),
                    before_sleep=before_sleep,
                    sleep=self._sleep,
                    reraise=False,
                ),
            )
        except RetryError as err:
            last = err.last_attempt.exception()
            raise EngineUnavailable(
                f"{what}: gave up after {err.last_attempt.attempt_number} attempts"
                f"{budget.describe()}; last error: {last}"
            ) from last

    async def _call(
        self, url: str, method: str, path: str, body: Any = None, *, what: str = "", **kw: Any
    ) -> httpx.Response:
        """One request to ``url`` under the retry policy (``kw`` as :meth:`_request_once`'s)."""
        send = functools.partial(self._request_once, url, method, path, json_body=body, **kw)
        return await self._retrying(what or f"{method} {url}{path}", send)

    async def _request_once(
        self,
        url: str,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        stream: bool = False,
        on_connect_failure: Callable[[str], None] | None = None,
        account: bool = True,
    ) -> httpx.Response:
        """One HTTP exchange with load accounting and error translation.

        A streamed response is returned open and counted; the caller closes it and calls
        ``Router.release``. ``account=False``: a URL that is not a routing target.
        """
        if account:
            self._acquire(url)
        keep_open = False
        failed = True
        try:
            try:
                request = self._http.build_request(method, self._url(url, path), **_body(json_body))
                response = await self._http.send(request, stream=stream)
            except (httpx.HTTPError, httpx.InvalidURL) as exc:
                raise self._send_failed(exc, url, path, on_connect_failure, account) from exc
            if not response.is_success:
                content = await _read_body(response) if stream else response.content
                if stream:
                    await response.aclose()
                raise self._status_failed(url, path, response.status_code, content, account)
            if account:
                self._router.note_ok(url)
            failed = False
            keep_open = stream
            return response
        finally:
            if account and not keep_open:
                self._router.release(url, failed=failed)

    async def _request_bytes(
        self,
        url: str,
        path: str,
        json_body: Any,
        *,
        on_connect_failure: Callable[[str], None] | None = None,
    ) -> bytes:
        """One POST answered by its whole body: :meth:`_request_once` without httpx's objects.

        The generate hot path, over aiohttp directly; any other transport or event loop
        takes :meth:`_request_once` itself.
        """
        # Encoded first, and the body dropped: its id list is a Python int per token (about
        # 40 bytes each, ten times the request's own array), which would otherwise stay
        # alive as long as the server takes (benchmarks/bench_inflight_memory.py).
        raw = self._raw
        if raw is None or not _on_asyncio():
            body = _wire.encode_json(json_body)
            del json_body
            response = await self._request_once(
                url, "POST", path, json_body=body, on_connect_failure=on_connect_failure
            )
            return response.content
        # Over aiohttp even the encoded bytes go once written: nothing of the conversation
        # but the caller's own ids waits with the request.
        sent_once = SentOnceBody(_wire.encode_json(json_body))
        del json_body
        headers = self._raw_headers
        if headers is None:
            headers = [*self._http.headers.multi_items(), *_JSON_HEADERS.items()]
            self._raw_headers = headers
        self._acquire(url)
        failed = True
        try:
            try:
                status, content = await raw.exchange(
                    "POST",
                    self._raw_url(url, path),
                    content=sent_once,
                    headers=headers,
                    timeouts=self._http.timeout,
                )
            except (httpx.HTTPError, httpx.InvalidURL) as exc:
                raise self._send_failed(exc, url, path, on_connect_failure, True) from exc
            if not 200 <= status < 300:
                raise self._status_failed(url, path, status, content, True)
            self._router.note_ok(url)
            failed = False
            return content
        finally:
            self._router.release(url, failed=failed)

    def _send_failed(
        self,
        exc: Exception,
        url: str,
        path: str,
        on_connect_failure: Callable[[str], None] | None,
        account: bool,
    ) -> EngineError:
        """What a request that got no answer raises, with the router told."""
        if on_connect_failure is not None and _is_connect_failure(exc):
            on_connect_failure(url)
        if account and not isinstance(exc, httpx.InvalidURL | httpx.UnsupportedProtocol):
            self._router.note_fault(url)
        return _translate(exc, url=url + path)

    def _status_failed(
        self, url: str, path: str, status: int, content: bytes, account: bool
    ) -> EngineError:
        """What an error status raises, with the router told."""
        if account:
            self._note_status(url, status)
        message = _wire.error_message(content, status)
        return _wire.error_from_status(status, message, url=url + path, engine=self._ENGINE)

    def _note_status(self, url: str, status: int) -> None:
        """Failover's view of an error status: 5xx is a server fault; 429 is a busy but
        live server (neither); any other 4xx means it is up and answering."""
        if status >= 500:
            self._router.note_fault(url)
        elif status != 429:
            self._router.note_ok(url)

    def _url(self, base: str, path: str) -> httpx.URL:
        """``base + path`` parsed once (httpx parses a string URL on every request)."""
        key = (base, path)
        url = self._urls.get(key)
        if url is None:
            if len(self._urls) >= 4096:
                self._urls.clear()
            url = self._urls[key] = httpx.URL(base + path)
        return url

    def _raw_url(self, base: str, path: str) -> URL:
        """``base + path`` as aiohttp's URL, parsed once (as :meth:`_url`)."""
        key = (base, path)
        url = self._raw_urls.get(key)
        if url is None:
            if len(self._raw_urls) >= 4096:
                self._raw_urls.clear()
            url = self._raw_urls[key] = URL(str(self._url(base, path)), encoded=True)
        return url


def _on_asyncio() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # trio (httpx's own transport serves it)
        return False
    return True
