"""One retrying POST for the tools that call an HTTP service (sandbox, search).

Connection errors and overload answers are retried with exponential backoff and jitter.
When the service is the run's own (``toolrollout sandbox serve`` or the local retriever,
started by :mod:`toolrollout._supervisor`), each attempt first waits while it restarts
(bounded), is sent once more to the new process when the old one had just died (the
connection was refused: nothing was sent; this is no retry of the call), and a failure
says what happened to the process (:attr:`RetryingPost.fault`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import anyio
import httpx
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from toolrollout._supervisor import SupervisedService, until_serving

__all__ = ["RetryableAnswer", "RetryingPost"]


class RetryableAnswer(Exception):
    """The service answered with one of :attr:`RetryingPost.retry_statuses`."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"HTTP {response.status_code}")
        self.response = response


@dataclass(kw_only=True)
class RetryingPost:
    """POST a body to :attr:`url` until an answer that is not retried, or the retries end.

    :meth:`send` returns the answer, or raises the last attempt's failure: an httpx error
    or :class:`RetryableAnswer`. One object per call: :attr:`attempts` and :meth:`fault`
    describe that call.
    """

    client: httpx.AsyncClient
    url: str
    retries: int
    """Attempts after the first one."""
    backoff: float
    """First wait in seconds, doubled each time, plus up to :attr:`jitter` seconds."""
    max_backoff: float
    jitter: float
    retry_statuses: frozenset[int]
    retry_read_timeouts: bool
    """Also retry an attempt that was sent but not answered in time (connect and pool
    timeouts, where nothing was sent, are always retried)."""
    local: bool
    """Whether the service may be the run's own, supervised in this process."""
    attempts: int = 0
    _service: SupervisedService | None = None
    _generation: int = 0

    def _retried(self, exc: BaseException) -> bool:
        if isinstance(exc, RetryableAnswer):
            return True
        if isinstance(exc, httpx.TimeoutException) and not isinstance(
            exc, httpx.ConnectTimeout | httpx.PoolTimeout
        ):
            return self.retry_read_timeouts
        return isinstance(exc, httpx.TransportError)

    async def send(self, body: Any) -> httpx.Response:
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.retries + 1),
            wait=wait_exponential(multiplier=self.backoff, max=self.max_backoff)
            + wait_random(0, self.jitter),
            retry=retry_if_exception(self._retried),
            sleep=anyio.sleep,
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                self.attempts += 1
                response = await self._once(body)
                if response.status_code in self.retry_statuses:
                    raise RetryableAnswer(response)
                return response
        raise AssertionError("unreachable: tenacity either returns or raises")

    async def _once(self, body: Any) -> httpx.Response:
        if self.local:
            self._service = await until_serving(httpx.URL(self.url).port or 80)
        service = self._service
        if service is None:
            return await self.client.post(self.url, json=body)
        self._generation, serving = service.generation, service.serving
        try:
            return await self.client.post(self.url, json=body)
        except httpx.ConnectError:
            # Refused by a process that was serving: it died just before. Once more on
            # the restarted one.
            if not (serving and await service.until_replaced(self._generation)):
                raise
            self._generation = service.generation
            return await self.client.post(self.url, json=body)

    def fault(self) -> str:
        """`` (what happened to the run's own service)`` during the last attempt, when
        known; else ``""``."""
        text = None if self._service is None else self._service.fault(self._generation)
        return "" if text is None else f" ({text})"
