"""The aiohttp transport behind httpx (toolrollout._http), against real sockets.

Each test runs a small HTTP/1.1 server on loopback (asyncio streams) that answers, drops
the connection, or stays silent, and checks what an httpx client over the transport sees.
"""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import httpx
import pytest

from tests._processes import free_port
from toolrollout._http import AiohttpTransport, fast_transport
from toolrollout.engines import SGLangClient

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, dict[str, str], bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return lines[0], headers, body


def _answer(status: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    return f"HTTP/1.1 {status}\r\ncontent-length: {len(body)}\r\n{extra}\r\n".encode() + body


@asynccontextmanager
async def _server(handler: Handler) -> AsyncIterator[str]:
    port = free_port()
    server = await asyncio.start_server(handler, "127.0.0.1", port)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers each request on the connection with what it received, as JSON."""
    try:
        while True:
            line, headers, body = await _read_request(reader)
            payload = json.dumps({"line": line, "headers": headers, "body": body.decode()})
            writer.write(_answer("200 OK", payload.encode(), {"content-type": "application/json"}))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


@pytest.mark.asyncio
async def test_round_trip_keeps_method_path_headers_and_body() -> None:
    async with (
        _server(_echo) as url,
        httpx.AsyncClient(transport=AiohttpTransport(), headers={"X-Trace": "t1"}) as client,
    ):
        response = await client.post(f"{url}/generate?x=1", json={"input_ids": [1, 2, 3]})
        second = await client.get(f"{url}/health")
    assert response.status_code == 200
    seen = response.json()
    assert seen["line"] == "POST /generate?x=1 HTTP/1.1"
    assert json.loads(seen["body"]) == {"input_ids": [1, 2, 3]}
    assert seen["headers"]["content-type"] == "application/json"
    assert seen["headers"]["x-trace"] == "t1"
    assert second.json()["line"] == "GET /health HTTP/1.1"
    assert response.http_version == "HTTP/1.1"


@pytest.mark.asyncio
async def test_compressed_answers_are_decoded_by_httpx() -> None:
    text = json.dumps({"text": "x" * 1000}).encode()

    async def gzipped(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(_answer("200 OK", gzip.compress(text), {"content-encoding": "gzip"}))
        await writer.drain()
        writer.close()

    async with _server(gzipped) as url, httpx.AsyncClient(transport=AiohttpTransport()) as client:
        response = await client.get(f"{url}/x")
    assert response.content == text


@pytest.mark.asyncio
async def test_streamed_answer_arrives_chunk_by_chunk() -> None:
    async def chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for part in (b"data: 1\n\n", b"data: 2\n\n"):
            writer.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            await writer.drain()
            await asyncio.sleep(0.05)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    async with (
        _server(chunked) as url,
        httpx.AsyncClient(transport=AiohttpTransport()) as client,
        client.stream("POST", f"{url}/generate", json={}) as response,
    ):
        lines = [line async for line in response.aiter_lines() if line]
    assert lines == ["data: 1", "data: 2"]


@pytest.mark.asyncio
async def test_refused_connection_is_a_connect_error() -> None:
    async with httpx.AsyncClient(transport=AiohttpTransport()) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(f"http://127.0.0.1:{free_port()}/health")


@pytest.mark.asyncio
async def test_connection_dropped_after_the_request_is_not_a_connect_failure() -> None:
    async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.close()

    async with _server(drop) as url, httpx.AsyncClient(transport=AiohttpTransport()) as client:
        with pytest.raises(httpx.TransportError) as caught:
            await client.post(f"{url}/generate", json={})
    # The request reached the server: an engine client must not treat it as unsent.
    assert not isinstance(caught.value, httpx.ConnectError | httpx.ConnectTimeout)
    assert isinstance(caught.value, httpx.RemoteProtocolError)


@pytest.mark.asyncio
async def test_silent_server_is_a_read_timeout() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        await asyncio.sleep(5)
        writer.close()

    timeout = httpx.Timeout(0.3, connect=5.0)
    async with (
        _server(silent) as url,
        httpx.AsyncClient(transport=AiohttpTransport(), timeout=timeout) as client,
    ):
        with pytest.raises(httpx.ReadTimeout):
            await client.post(f"{url}/generate", json={})


def test_one_client_survives_two_event_loops() -> None:
    """A client built once and used from two ``asyncio.run`` calls reconnects in each."""

    async def one_call(client: httpx.AsyncClient) -> int:
        async with _server(_echo) as url:
            return (await client.get(f"{url}/health")).status_code

    client = httpx.AsyncClient(transport=fast_transport())
    assert asyncio.run(one_call(client)) == 200
    assert asyncio.run(one_call(client)) == 200
    asyncio.run(client.aclose())


@pytest.mark.asyncio
async def test_engine_client_sends_over_aiohttp_unless_given_a_transport() -> None:
    async with SGLangClient("http://127.0.0.1:1") as default:
        assert isinstance(default._http._transport, AiohttpTransport)
    mock = httpx.MockTransport(lambda request: httpx.Response(200))
    async with SGLangClient("http://127.0.0.1:1", transport=mock) as mocked:
        assert mocked._http._transport is mock


def _sglang_answer(body: bytes) -> bytes:
    rid = json.loads(body)["rid"]
    meta = {
        "id": rid,
        "finish_reason": {"type": "stop", "matched": 6},
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "output_token_logprobs": [[-0.25, 5, None], [-0.5, 6, None]],
    }
    return json.dumps({"output_ids": [5, 6], "meta_info": meta}).encode()


@pytest.mark.asyncio
async def test_generate_sends_without_httpx_objects_with_the_clients_headers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The hot path (AiohttpTransport.exchange) sends what httpx would: the client's headers,
    a JSON body; httpx's own send is not used for it."""
    seen: list[tuple[str, dict[str, str], bytes]] = []

    async def generate(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line, headers, body = await _read_request(reader)
                seen.append((line, headers, body))
                writer.write(_answer("200 OK", _sglang_answer(body)))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def no_httpx(*args: object, **kwargs: object) -> httpx.Response:
        raise AssertionError("generate went through httpx.AsyncClient.send")

    from toolrollout.engines import GenerateRequest

    async with _server(generate) as url:
        async with SGLangClient(url, api_key="k1", headers={"X-Trace": "t1"}) as client:
            expected = {k.lower(): v for k, v in client._http.headers.items()}
            monkeypatch.setattr(httpx.AsyncClient, "send", no_httpx)
            result = await client.generate(GenerateRequest(input_ids=(1, 2, 3), rid="r1"))
    assert result.output_ids == (5, 6) and result.output_logprobs == (-0.25, -0.5)
    line, headers, body = seen[0]
    assert line == "POST /generate HTTP/1.1"
    assert headers["authorization"] == "Bearer k1" and headers["x-trace"] == "t1"
    assert headers["content-type"] == "application/json"
    for name in ("user-agent", "accept", "accept-encoding"):
        assert headers[name] == expected[name]
    assert json.loads(body)["input_ids"] == [1, 2, 3]


@pytest.mark.asyncio
async def test_generate_reads_a_compressed_answer_and_retries_a_dropped_connection() -> None:
    from toolrollout._retry import RetryPolicy
    from toolrollout.engines import GenerateRequest

    requests: list[bytes] = []

    async def flaky(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _, _, body = await _read_request(reader)
        requests.append(body)
        if len(requests) == 1:  # the first attempt: dropped after the request arrived
            writer.close()
            return
        answer = gzip.compress(_sglang_answer(body))
        writer.write(_answer("200 OK", answer, {"content-encoding": "gzip"}))
        await writer.drain()
        writer.close()

    retry = RetryPolicy(max_attempts=3, initial_backoff=0.01, max_backoff=0.01, budget_s=None)
    async with _server(flaky) as url, SGLangClient(url, retry=retry) as client:
        result = await client.generate(GenerateRequest(input_ids=(1, 2, 3), rid="r2"))
        stats = client.stats()
    assert result.output_ids == (5, 6)
    assert [json.loads(b)["rid"] for b in requests] == ["r2", "r2-retry1"]
    assert stats.retries == 1 and stats.failures == 0
