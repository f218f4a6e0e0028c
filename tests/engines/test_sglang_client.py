"""Behaviour of SGLangClient: retries, routing, abort, health, errors, statistics.

The servers are ``httpx.MockTransport`` handlers (the client's documented test seam);
requests that must stay in flight are held open on an ``anyio.Event``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from toolrollout._exceptions import (
    EngineConnectionError,
    EngineError,
    EngineHTTPError,
    EngineRequestRejected,
    EngineTimeout,
    EngineUnavailable,
    ToolRolloutError,
    UserError,
)
from toolrollout.engines._types import GenerateRequest, SamplingParams
from toolrollout.engines.sglang import RetryPolicy, SGLangClient

FIXTURES = Path(__file__).parent / "fixtures"
S0, S1 = "http://s0:30000", "http://s1:30000"
NO_WAIT = RetryPolicy(max_attempts=4, initial_backoff=0.0, max_backoff=0.0, jitter=0.0)

Handler = Callable[[httpx.Request], Coroutine[None, None, httpx.Response]]


def ok_body(rid: str, ids: tuple[int, ...] = (11, 12, 151645)) -> dict[str, Any]:
    """A finished /generate answer shaped like fixtures/sglang_generate_stop_eos.json."""
    template = json.loads((FIXTURES / "sglang_generate_stop_eos.json").read_text())
    meta = template["meta_info"]
    meta["id"] = rid
    meta["output_token_logprobs"] = [[-0.5, i, None] for i in ids]
    meta["output_token_logprobs_length"] = meta["completion_tokens"] = len(ids)
    meta["finish_reason"] = {"type": "stop", "matched": ids[-1]}
    template["output_ids"] = list(ids)
    return dict(template)


def answer(request: httpx.Request, status: int = 200) -> httpx.Response:
    """Echo the request's rid in a valid answer."""
    body = json.loads(request.content)
    return httpx.Response(status, json=ok_body(body["rid"]))


def host(request: httpx.Request) -> str:
    return f"http://{request.url.host}:{request.url.port}"


def make(handler: Handler, urls: tuple[str, ...] = (S0,), **kwargs: Any) -> SGLangClient:
    kwargs.setdefault("retry", NO_WAIT)
    return SGLangClient(urls, transport=httpx.MockTransport(handler), **kwargs)


def req(rid: str | None = None, session: str | None = None) -> GenerateRequest:
    return GenerateRequest(input_ids=(1, 2, 3), rid=rid, session_id=session)


# ----------------------------------------------------------------------- retries


@pytest.mark.parametrize("status", [500, 502, 503, 429])
async def test_retries_transient_status_then_succeeds(status: int) -> None:
    calls: list[dict[str, Any]] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        calls.append(json.loads(request.content))
        if len(calls) <= 2:
            return httpx.Response(status, json={"error": {"message": "busy"}})
        return answer(request)

    async with make(handler) as client:
        result = await client.generate(req("r1"))
        stats = client.stats()
    assert result.rid == "r1" and result.output_ids == (11, 12, 151645)
    # A retry gets a fresh wire rid: SGLang rejects a duplicate id still registered.
    assert [c["rid"] for c in calls] == ["r1", "r1-retry1", "r1-retry2"]
    assert stats.retries == 2 and stats.failures == 0 and stats.total_requests == 1
    assert stats.servers[0].failures == 2 and stats.servers[0].requests == 3


@pytest.mark.parametrize(
    "error",
    [
        httpx.ConnectError("connection refused"),
        httpx.ConnectTimeout("connect timed out"),
        httpx.RemoteProtocolError("server disconnected without sending a response"),
        httpx.ReadError("connection reset by peer"),
    ],
)
async def test_retries_connection_errors_then_succeeds(error: httpx.HTTPError) -> None:
    calls = 0

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise error
        return answer(request)

    async with make(handler) as client:
        result = await client.generate(req("r"))
    assert calls == 2 and result.finish_reason.type == "stop"


@pytest.mark.parametrize("status", [400, 401, 404, 422])
async def test_no_retry_on_client_errors(status: int) -> None:
    calls = 0

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return httpx.Response(status, json={"error": {"message": f"nope {status}"}})

    async with make(handler) as client:
        with pytest.raises(EngineRequestRejected, match=f"nope {status}") as info:
            await client.generate(req())
        assert client.stats().failures == 1
    assert calls == 1
    assert info.value.status_code == status
    assert info.value.url == f"{S0}/generate"


async def test_gives_up_after_budget_with_engine_unavailable() -> None:
    calls = 0

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        raise httpx.ConnectError("connection refused")

    async with make(handler, retry=RetryPolicy(max_attempts=3, initial_backoff=0, jitter=0)) as c:
        with pytest.raises(EngineUnavailable, match="gave up after 3 attempts") as info:
            await c.generate(req())
        stats = c.stats()
    assert calls == 3
    assert isinstance(info.value.__cause__, EngineConnectionError)
    assert isinstance(info.value.__cause__.__cause__, httpx.ConnectError)  # chained, not lost
    assert stats.failures == 1 and stats.retries == 2 and stats.in_flight == 0


async def test_read_timeout_is_not_retried_unless_asked() -> None:
    calls = 0

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise httpx.ReadTimeout("timed out")
        return answer(request)

    async with make(handler) as client:
        with pytest.raises(EngineTimeout):
            await client.generate(req())
    assert calls == 1

    calls = 0
    policy = RetryPolicy(max_attempts=3, initial_backoff=0, jitter=0, retry_timeouts=True)
    async with make(handler, retry=policy) as client:
        result = await client.generate(req())
    assert calls == 2 and result.output_ids == (11, 12, 151645)


async def test_backoff_is_exponential_and_bounded() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503)

    policy = RetryPolicy(max_attempts=7, initial_backoff=0.01, max_backoff=0.05, jitter=0.005)
    sleeps: list[float] = []

    async def record(seconds: float) -> None:
        sleeps.append(seconds)

    async with make(handler, retry=policy) as client:
        client._sleep = record  # type: ignore[method-assign]
        with pytest.raises(EngineUnavailable):
            await client.generate(req())
    assert len(sleeps) == 6
    assert 0.01 <= sleeps[0] <= 0.015
    assert 0.02 <= sleeps[1] <= 0.025
    assert all(s <= 0.05 for s in sleeps)
    assert sleeps[-1] == pytest.approx(0.05)
    assert all(policy.backoff(k) <= policy.max_backoff for k in range(1, 100))


async def test_httpx_errors_never_escape() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.RemoteProtocolError("peer closed connection without sending complete body")

    async with make(handler) as client:
        with pytest.raises(ToolRolloutError) as info:
            await client.generate(req())
        with pytest.raises(EngineError):
            await client.model_info()
    assert not isinstance(info.value, httpx.HTTPError)
    assert isinstance(info.value, EngineUnavailable)


async def test_malformed_json_body_is_engine_error_and_not_retried() -> None:
    calls = 0

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return httpx.Response(200, content=b'{"text": "trunc')

    async with make(handler) as client:
        with pytest.raises(EngineError, match="not valid JSON") as info:
            await client.generate(req())
    assert type(info.value) is EngineError
    assert calls == 1


# ----------------------------------------------------------------------- routing


async def test_sticky_session_stays_on_one_server() -> None:
    seen: list[tuple[str, str]] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append((json.loads(request.content)["rid"], host(request)))
        return answer(request)

    async with make(handler, urls=(S0, S1)) as client:
        for turn in range(4):
            await client.generate(req(f"a-{turn}", session="traj-a"))
            await client.generate(req(f"b-{turn}", session="traj-b"))
        stats = client.stats()
    servers_a = {url for rid, url in seen if rid.startswith("a-")}
    servers_b = {url for rid, url in seen if rid.startswith("b-")}
    assert len(servers_a) == 1 and len(servers_b) == 1
    assert servers_a != servers_b  # the second session goes to the server with no session
    assert stats.sessions == 2 and [s.sessions for s in stats.servers] == [1, 1]


async def test_least_outstanding_picks_the_idle_server() -> None:
    release = anyio.Event()
    holding = anyio.Event()
    arrived: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        rid = json.loads(request.content)["rid"]
        arrived.append(f"{rid}@{host(request)}")
        if rid.startswith("held"):
            holding.set()
            await release.wait()
        return answer(request)

    async with make(handler, urls=(S0, S1)) as client:
        with anyio.fail_after(5):
            async with anyio.create_task_group() as group:
                group.start_soon(client.generate, req("held-1"))
                await holding.wait()
                busy = arrived[0].split("@")[1]
                stats = client.stats()
                assert {s.url: s.outstanding for s in stats.servers}[busy] == 1
                # A new request (no session) while one is in flight: the idle server.
                await client.generate(req("free-1"))
                await client.generate(req("free-2"))
                release.set()
    idle = S1 if busy == S0 else S0
    assert f"free-1@{idle}" in arrived and f"free-2@{idle}" in arrived
    assert client.stats().outstanding == 0


async def test_new_session_moves_off_a_refusing_server_but_sticky_does_not() -> None:
    down = {S0}
    hits: Counter[str] = Counter()

    async def handler(request: httpx.Request) -> httpx.Response:
        hits[host(request)] += 1
        if host(request) in down:
            raise httpx.ConnectError("connection refused")
        return answer(request)

    # failover off: a pinned session stays (tests/faults/test_failover.py covers moving it)
    async with make(handler, urls=(S0, S1), failover_after=None) as client:
        first = await client.generate(req("x", session="new"))
        assert first.server_url == S1  # tried S0 (refused), then moved to S1
        assert hits == {S0: 1, S1: 1}

        down = {S1}  # the pinned server goes down: retry it, do not move the session
        hits.clear()
        with pytest.raises(EngineUnavailable):
            await client.generate(req("y", session="new"))
        assert hits == {S1: NO_WAIT.max_attempts}

        assert client.release_session("new") is True  # explicit unpin lets it move
        result = await client.generate(req("z", session="new"))
        assert result.server_url == S0


async def test_session_map_is_bounded_lru() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        return answer(request)

    async with make(handler, urls=(S0, S1), max_sessions=2) as client:
        for session in ("a", "b", "a", "c"):  # "b" is the least recently used when "c" comes
            await client.generate(req(session=session))
        assert client.stats().sessions == 2
        assert client.release_session("b") is False
        assert client.release_session("a") is True
        assert client.stats().sessions == 1


# ----------------------------------------------------------------------- abort


async def test_abort_goes_to_the_server_holding_the_request() -> None:
    aborts: list[tuple[str, dict[str, Any]]] = []
    started = anyio.Event()
    aborted = anyio.Event()
    partial = json.loads((FIXTURES / "sglang_generate_abort_running.json").read_text())

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/abort_request":
            aborts.append((host(request), json.loads(request.content)))
            aborted.set()
            return httpx.Response(200)
        if json.loads(request.content)["rid"] == "ep42-t4":
            started.set()
            await aborted.wait()
            return httpx.Response(200, json=partial)
        return answer(request)

    async with make(handler, urls=(S0, S1)) as client:
        await client.generate(req("warm", session="other"))  # pins S0, so the next goes to S1
        results = []

        async def run() -> None:
            results.append(await client.generate(req("ep42-t4", session="traj")))

        with anyio.fail_after(5):
            async with anyio.create_task_group() as group:
                group.start_soon(run)
                await started.wait()
                await client.abort("ep42-t4")
    assert aborts == [(S1, {"rid": "ep42-t4"})]
    (result,) = results
    assert result.finish_reason.type == "abort" and result.output_ids == (151657, 198, 4913)


async def test_abort_behind_a_router_goes_to_every_worker() -> None:
    """sglang-router has no /abort_request: with abort_urls the client asks the workers."""
    router, w0, w1 = "http://router:30000", "http://w0:31001", "http://w1:31002"
    aborts: list[tuple[str, str]] = []
    started = anyio.Event()
    aborted = anyio.Event()
    partial = json.loads((FIXTURES / "sglang_generate_abort_running.json").read_text())

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/abort_request":
            aborts.append((host(request), json.loads(request.content)["rid"]))
            if len(aborts) == 2:
                aborted.set()
            return httpx.Response(200)
        assert host(request) == router
        started.set()
        await aborted.wait()
        return httpx.Response(200, json=partial)

    client = SGLangClient(router, transport=httpx.MockTransport(handler), abort_urls=[w0, w1])
    async with client:
        results = []

        async def run() -> None:
            results.append(await client.generate(req("ep42-t4")))

        with anyio.fail_after(5):
            async with anyio.create_task_group() as group:
                group.start_soon(run)
                await started.wait()
                await client.abort("ep42-t4")
        # the workers are not routing targets: no outstanding-request accounting for them
        assert {s.url for s in client.stats().servers} == {router}
    assert sorted(aborts) == [(w0, "ep42-t4"), (w1, "ep42-t4")]
    assert results[0].finish_reason.type == "abort"


async def test_abort_unknown_rid_sends_nothing() -> None:
    paths: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.path)
        return answer(request)

    async with make(handler) as client:
        await client.abort("never-sent")
        await client.generate(req("done"))
        await client.abort("done")  # already finished: nothing to abort
    assert paths == ["/generate"]


async def test_abort_during_backoff_returns_an_empty_aborted_result() -> None:
    paths: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.path)
        return httpx.Response(200 if request.url.path == "/abort_request" else 503)

    async with make(handler, retry=RetryPolicy(max_attempts=5, initial_backoff=0, jitter=0)) as c:

        async def sleep_then_abort(seconds: float) -> None:
            await c.abort("r")  # the user aborts while the client waits to retry

        c._sleep = sleep_then_abort  # type: ignore[method-assign]
        result = await c.generate(req("r"))
    assert result.finish_reason.type == "abort"
    assert result.output_ids == () and result.completion_tokens == 0
    assert paths == ["/generate", "/abort_request"]  # no retry after the abort


async def test_duplicate_rid_in_flight_is_a_user_error() -> None:
    arrived, release = anyio.Event(), anyio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        arrived.set()
        await release.wait()
        return answer(request)

    async with make(handler) as client:
        with anyio.fail_after(5):
            async with anyio.create_task_group() as group:
                group.start_soon(client.generate, req("same"))
                await arrived.wait()  # the first one is on the wire: in flight
                with pytest.raises(UserError, match="already in flight"):
                    await client.generate(req("same"))
                release.set()


# ----------------------------------------------------------------------- health, info


async def test_wait_healthy_times_out_cleanly() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        if host(request) == S0:
            return httpx.Response(200)
        return httpx.Response(503)

    async with make(handler, urls=(S0, S1)) as client:
        start = anyio.current_time()
        with pytest.raises(EngineUnavailable, match=r"http://s1:30000 \(HTTP 503\)") as info:
            await client.wait_healthy(timeout=0.3, interval=0.05)
        elapsed = anyio.current_time() - start
    assert 0.25 <= elapsed < 2.0
    assert S0 not in str(info.value)


async def test_wait_healthy_returns_once_all_servers_answer_200() -> None:
    polls: Counter[str] = Counter()

    async def handler(request: httpx.Request) -> httpx.Response:
        polls[host(request)] += 1
        if host(request) == S1 and polls[S1] < 3:
            raise httpx.ConnectError("not listening yet")
        return httpx.Response(200)

    async with make(handler, urls=(S0, S1)) as client:
        with anyio.fail_after(5):
            await client.wait_healthy(timeout=5, interval=0.01)
    assert polls[S1] == 3
    assert polls[S0] == 1  # a healthy server is not polled again


async def test_flush_cache_hits_every_server_and_reports_refusal() -> None:
    flushed: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        flushed.append(f"{request.method} {host(request)}{request.url.path}")
        if host(request) == S1:
            return httpx.Response(400, text="Cache flushed.\nPlease check backend logs")
        return httpx.Response(200, text="Cache flushed.")

    async with make(handler, urls=(S0, S1)) as client:
        assert await client.flush_cache() is False  # S1 refused with HTTP 400
    assert flushed == [f"POST {S0}/flush_cache", f"POST {S1}/flush_cache"]


async def test_server_info_falls_back_to_legacy_path() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/get_server_info":
            return httpx.Response(200, json={"context_length": 32768, "version": "0.4.9"})
        return httpx.Response(404, json={"detail": "Not Found"})

    async with make(handler, urls=(S0, S1)) as client:
        info = await client.server_info(S1)
        with pytest.raises(UserError):
            await client.server_info("http://elsewhere:1")
    assert info["context_length"] == 32768


# ----------------------------------------------------------------------- misc


async def test_api_key_header_and_closed_client() -> None:
    headers: list[str | None] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        headers.append(request.headers.get("authorization"))
        return answer(request)

    client = make(handler, api_key="sk-test")
    async with client:
        await client.generate(req())
    assert headers == ["Bearer sk-test"]
    with pytest.raises(UserError, match="closed"):
        await client.generate(req())


async def test_stream_open_is_retried_and_counts_outstanding() -> None:
    calls = 0
    stream = (FIXTURES / "sglang_stream_cumulative.txt").read_bytes()

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls == 1:
            return httpx.Response(502, text="Bad Gateway")
        return httpx.Response(200, content=stream, headers={"content-type": "text/event-stream"})

    async with make(handler) as client:
        outstanding = []
        async for chunk in client.stream(GenerateRequest(input_ids=(1,) * 12, rid="s-1")):
            outstanding.append(client.stats().outstanding)
            last = chunk
        assert client.stats().outstanding == 0
    assert calls == 2
    assert outstanding == [1, 1, 1]
    assert last.result is not None and last.result.output_ids[-1] == 151645


def test_bad_configuration_is_a_user_error() -> None:
    with pytest.raises(UserError):
        SGLangClient([])
    with pytest.raises(UserError):
        SGLangClient("localhost:30000")  # no scheme
    with pytest.raises(UserError):
        SGLangClient([S0, S0 + "/"])
    with pytest.raises(UserError):
        RetryPolicy(max_attempts=0)


async def test_n_greater_than_one_is_refused() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        raise AssertionError("must not be sent")

    async with make(handler) as client:
        with pytest.raises(UserError, match="one request per sample"):
            await client.generate(GenerateRequest(input_ids=(1,), sampling=SamplingParams(n=2)))


async def test_5xx_errors_keep_status_and_message() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, json={"error": {"message": "CUDA error: out of memory"}})

    async with make(handler, retry=RetryPolicy(max_attempts=1)) as client:
        with pytest.raises(EngineUnavailable) as info:
            await client.generate(req())
    cause = info.value.__cause__
    assert isinstance(cause, EngineHTTPError) and not isinstance(cause, EngineRequestRejected)
    assert cause.status_code == 500 and "out of memory" in cause.message
