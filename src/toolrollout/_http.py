"""An httpx transport over aiohttp, for the clients that sit on the rollout's hot path.

Why: at a thousand concurrent trajectories the engine client sends hundreds of requests a
second from one event loop, and httpx's default transport (httpcore, with the pure-Python
h11 parser) spends several milliseconds of CPU on each, growing with the number of open
connections. aiohttp parses HTTP in C and keeps its pool in O(1) structures; behind httpx's
API it cuts the client's CPU per request by half or more (``docs/benchmarks.md``). Callers
keep httpx's request/response types, timeouts and ``MockTransport`` test seam.

Why not the ``httpx-aiohttp`` package: it reports a connection that the server dropped
after receiving the request as ``httpx.ConnectTimeout``, and to the engine client a connect
failure means "this server was never reached": it steers the trajectory to another server
and counts the request as unsent. Here every aiohttp error becomes the httpx error that
says what happened (connect failure, read timeout, dropped connection, bad answer).

Under a non-asyncio event loop (trio) the transport hands requests to httpx's own.

:meth:`AiohttpTransport.exchange` is the engine client's hot path: one request with a body
in memory, answered by the status and the whole body, without building httpx's request and
response objects (about a third of a bare POST's CPU through httpx's API, measured in
``docs/benchmarks.md``). Its errors are the same httpx errors the transport raises.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import aiohttp
import httpx
import sniffio
from yarl import URL

__all__ = ["AiohttpTransport", "SentOnceBody", "fast_transport"]

_CHUNK = 64 * 1024
# httpx writes these itself (or we pass them through verbatim); aiohttp must not add its own.
_SKIP_AUTO_HEADERS = frozenset({"User-Agent", "Accept", "Accept-Encoding", "Content-Type"})


def _httpx_error(exc: BaseException, request: httpx.Request) -> httpx.TransportError | None:
    """The httpx error that says what ``exc`` means, or ``None`` if it is not a transport one."""
    message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    error: type[httpx.TransportError]
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        error = httpx.ConnectTimeout  # no connection (or pool slot) in time: nothing was sent
    elif isinstance(exc, aiohttp.ServerTimeoutError | asyncio.TimeoutError):
        error = httpx.ReadTimeout
    elif isinstance(exc, aiohttp.ClientConnectorError):
        error = httpx.ConnectError  # refused, unreachable, DNS, TLS handshake
    elif isinstance(exc, aiohttp.ServerDisconnectedError):
        error = httpx.RemoteProtocolError  # the server closed the connection mid-exchange
    elif isinstance(exc, aiohttp.InvalidURL):
        error = httpx.UnsupportedProtocol
    elif isinstance(exc, aiohttp.ClientResponseError):
        error = httpx.RemoteProtocolError  # a malformed answer
    elif isinstance(exc, aiohttp.ClientPayloadError | aiohttp.ClientConnectionError):
        error = httpx.ReadError
    elif isinstance(exc, aiohttp.ClientError):
        error = httpx.TransportError
    else:
        return None
    return error(message, request=request)


class _AiohttpStream(httpx.AsyncByteStream):
    def __init__(self, response: aiohttp.ClientResponse, request: httpx.Request) -> None:
        self._response = response
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.content.iter_chunked(_CHUNK):
                yield chunk
        except Exception as exc:
            mapped = _httpx_error(exc, self._request)
            if mapped is None:
                raise
            raise mapped from exc

    async def aclose(self) -> None:
        # release() hands a fully read connection back to the pool, close() drops it.
        if self._response.content.at_eof():
            self._response.release()
        else:
            self._response.close()


class _Bytes(httpx.AsyncByteStream):
    """A body already read, as the stream httpx decodes a compressed answer from."""

    def __init__(self, body: bytes) -> None:
        self._body = body

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self._body


class SentOnceBody(aiohttp.BytesPayload):
    """A request body that lets go of its bytes once they are written to the connection.

    aiohttp keeps a request's payload until the answer has been read. A ``/generate`` body
    holds the whole conversation (about 6.4 bytes a token as JSON) and the answer can take
    the server minutes, so the body would be held all that time; written once, it is no
    longer needed (a retry encodes the request again). Its size, and so the
    ``Content-Length``, is fixed when it is made.
    """

    async def write_with_length(
        self, writer: aiohttp.abc.AbstractStreamWriter, content_length: int | None
    ) -> None:
        value, self._value = self._value, b""
        await writer.write(value if content_length is None else value[:content_length])

    async def write(self, writer: aiohttp.abc.AbstractStreamWriter) -> None:
        await self.write_with_length(writer, None)


class AiohttpTransport(httpx.AsyncBaseTransport):
    """``httpx.AsyncClient(transport=AiohttpTransport(limits=...))``: same API, less CPU.

    The aiohttp session is created on first use inside the running loop (and again if a
    later request runs in another loop); :meth:`aclose` closes it.
    """

    def __init__(self, *, limits: httpx.Limits | None = None, verify: bool = True) -> None:
        self._limits = limits if limits is not None else httpx.Limits()
        self._verify = verify
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fallback: httpx.AsyncHTTPTransport | None = None

    def _session_for(self, loop: asyncio.AbstractEventLoop) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed or self._loop is not loop:
            limit = self._limits.max_connections or 0  # aiohttp: 0 means unlimited
            keepalive = self._limits.keepalive_expiry
            connector = aiohttp.TCPConnector(
                limit=limit,
                limit_per_host=0,
                keepalive_timeout=keepalive if keepalive is not None else 5.0,
                ssl=True if self._verify else False,  # aiohttp's own cached default context
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                auto_decompress=False,  # httpx decodes Content-Encoding itself
                skip_auto_headers=_SKIP_AUTO_HEADERS,
                timeout=aiohttp.ClientTimeout(total=None),
            )
            self._loop = loop
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if sniffio.current_async_library() != "asyncio":
            if self._fallback is None:
                self._fallback = httpx.AsyncHTTPTransport(limits=self._limits, verify=self._verify)
            return await self._fallback.handle_async_request(request)
        session = self._session_for(asyncio.get_running_loop())
        timeouts = request.extensions.get("timeout", {})
        body = await request.aread()
        try:
            response = await session.request(
                request.method,
                URL(str(request.url), encoded=True),
                headers=request.headers.multi_items(),
                data=body or None,
                allow_redirects=False,
                compress=False,
                timeout=aiohttp.ClientTimeout(
                    total=None,
                    connect=timeouts.get("pool"),
                    sock_connect=timeouts.get("connect"),
                    sock_read=timeouts.get("read"),
                ),
            )
        except Exception as exc:
            mapped = _httpx_error(exc, request)
            if mapped is None:
                raise
            raise mapped from exc
        return httpx.Response(
            status_code=response.status,
            headers=list(response.raw_headers),
            stream=_AiohttpStream(response, request),
            request=request,
            extensions={
                "http_version": b"HTTP/1.1",
                "reason_phrase": (response.reason or "").encode(),
            },
        )

    async def exchange(
        self,
        method: str,
        url: URL,
        *,
        content: bytes | SentOnceBody | None,
        headers: Sequence[tuple[str, str]],
        timeouts: httpx.Timeout,
    ) -> tuple[int, bytes]:
        """One request on the running asyncio loop, answered by its status and decoded body.

        What :meth:`handle_async_request` followed by reading the body does, with the same
        errors, the same headers (the caller passes the httpx client's own) and the same
        decoding of a compressed answer (by httpx's decoders), minus httpx's objects. Only
        under asyncio (the caller checks; under trio it uses httpx's API). A
        :class:`SentOnceBody` is let go once written, not kept until the answer.
        """
        loop = asyncio.get_running_loop()
        session = self._session_for(loop)
        try:
            async with session.request(
                method,
                url,
                headers=headers,
                data=content,
                allow_redirects=False,
                compress=False,
                timeout=aiohttp.ClientTimeout(
                    total=None,
                    connect=timeouts.pool,
                    sock_connect=timeouts.connect,
                    sock_read=timeouts.read,
                ),
            ) as response:
                body = await response.read()
                status = response.status
                encoding = response.headers.get("Content-Encoding", "")
                raw_headers = response.raw_headers if encoding else ()
        except Exception as exc:
            mapped = _httpx_error(exc, httpx.Request(method, str(url)))
            if mapped is None:
                raise
            raise mapped from exc
        if encoding and encoding.lower() != "identity":  # as httpx would decode it
            decoded = httpx.Response(status, headers=list(raw_headers), stream=_Bytes(body))
            body = await decoded.aread()
        return status, body

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None and not session.closed:
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is self._loop:
                await session.close()
            # else its loop has ended and took the session's connections with it
        if self._fallback is not None:
            await self._fallback.aclose()
            self._fallback = None


def fast_transport(limits: httpx.Limits | None = None) -> httpx.AsyncBaseTransport:
    """The transport toolrollout's long-lived HTTP clients use by default."""
    return AiohttpTransport(limits=limits)
