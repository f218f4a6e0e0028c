"""SecurityMiddleware at the ASGI level: keys with SGLang's semantics, 413 before the body is
read, 429 with Retry-After, and the bind check.

The app under the middleware counts the body bytes it receives, so "refused before the body
is read" is checked as "the app got none (or no more than the limit) of it", not by timing.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
import pytest

from toolrollout._exceptions import UserError
from toolrollout._security import (
    SecurityMiddleware,
    ServerSecurity,
    check_bind,
    is_loopback,
    resolve_key,
)

KEY = "user-key-ÄÖ-not-ascii"
ADMIN = "admin-key-123"


class CountingApp:
    """Reads its whole body and answers 200 with how many bytes it got."""

    def __init__(self) -> None:
        self.calls = 0
        self.body_bytes = 0
        self.gate: anyio.Event | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.calls += 1
        more = True
        while more:
            message = await receive()
            self.body_bytes += len(message.get("body", b""))
            more = message.get("more_body", False)
        if self.gate is not None:
            await self.gate.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


class CatchingApp(CountingApp):
    """Catches every error of its receive and answers 400, as FastAPI does for a body it
    cannot read: the middleware's 413 must still be what the client gets."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        except Exception:
            await send({"type": "http.response.start", "status": 400, "headers": []})
            await send({"type": "http.response.body", "body": b"bad body"})


def _scope(path: str, headers: dict[str, str], method: str = "POST") -> dict[str, Any]:
    raw = [(k.lower().encode(), v.encode("utf-8")) for k, v in headers.items()]
    return {"type": "http", "method": method, "path": path, "headers": raw}


async def _call(
    middleware: SecurityMiddleware,
    path: str = "/generate",
    headers: dict[str, str] | None = None,
    chunks: list[bytes] | None = None,
    method: str = "POST",
) -> tuple[int, dict[bytes, bytes], bytes, int]:
    """(status, headers, body, chunks the client handed over)."""
    pending = list(chunks or [b""])
    handed = 0

    async def receive() -> dict[str, Any]:
        nonlocal handed
        if not pending:
            await anyio.sleep_forever()
        handed += 1
        body = pending.pop(0)
        return {"type": "http.request", "body": body, "more_body": bool(pending)}

    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    await middleware(_scope(path, headers or {}, method), receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], dict(start["headers"]), body, handed


def run(coro: Any) -> Any:
    async def main() -> Any:
        return await coro

    return anyio.run(main)


ADMIN_PATHS = frozenset({"/flush_cache", "/update_weights_from_disk"})


def guarded(app: CountingApp | None = None, **options: Any) -> SecurityMiddleware:
    security = ServerSecurity(admin_paths=ADMIN_PATHS, **options)
    return SecurityMiddleware(app or CountingApp(), security)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_no_key_and_wrong_key_get_sglangs_401() -> None:
    app = CountingApp()
    mw = guarded(app, api_key=KEY)
    for headers in ({}, bearer("wrong"), {"Authorization": KEY}, {"Authorization": "Basic x"}):
        status, head, body, _ = run(_call(mw, headers=headers))
        assert (status, body) == (401, b'{"error":"Unauthorized"}')
        assert head[b"www-authenticate"] == b"Bearer"
    assert app.calls == 0
    assert run(_call(mw, headers=bearer(KEY)))[0] == 200
    assert run(_call(mw, headers={"Authorization": f"bearer {KEY}"}))[0] == 200
    assert run(_call(mw, headers={"x-api-key": KEY}))[0] == 200  # SGLang's second header
    assert app.calls == 3


def test_health_and_options_stay_open() -> None:
    mw = guarded(api_key=KEY, admin_api_key=ADMIN)
    for path in ("/health", "/health_generate", "/ready", "/metrics"):
        assert run(_call(mw, path, method="GET"))[0] == 200
    assert run(_call(mw, "/generate", method="OPTIONS"))[0] == 200
    assert run(_call(mw, "/server_info", method="GET"))[0] == 401


def test_admin_key_guards_control_endpoints() -> None:
    mw = guarded(api_key=KEY, admin_api_key=ADMIN)
    # the user key opens ordinary endpoints only; the admin key only control ones
    assert run(_call(mw, "/flush_cache", bearer(KEY)))[0] == 401
    assert run(_call(mw, "/flush_cache", bearer(ADMIN)))[0] == 200
    assert run(_call(mw, "/generate", bearer(ADMIN)))[0] == 401
    assert run(_call(mw, "/generate", bearer(KEY)))[0] == 200
    # API key alone: it opens the control endpoints too (SGLang's ADMIN_OPTIONAL)
    only_user = guarded(api_key=KEY)
    assert run(_call(only_user, "/flush_cache", bearer(KEY)))[0] == 200
    assert run(_call(only_user, "/flush_cache"))[0] == 401
    # admin key alone: ordinary endpoints are open, control ones need it
    only_admin = guarded(admin_api_key=ADMIN)
    assert run(_call(only_admin, "/generate"))[0] == 200
    assert run(_call(only_admin, "/update_weights_from_disk"))[0] == 401
    assert run(_call(only_admin, "/update_weights_from_disk", bearer(ADMIN)))[0] == 200
    # no key: all open
    assert run(_call(guarded(), "/flush_cache"))[0] == 200


def test_declared_oversized_body_is_refused_before_the_app_runs() -> None:
    app = CountingApp()
    mw = guarded(app, max_body_bytes=1000)
    status, _, body, handed = run(
        _call(mw, headers={"Content-Length": "200000000"}, chunks=[b"x" * 1000] * 3)
    )
    assert status == 413
    assert b"1000 bytes" in body
    assert (app.calls, app.body_bytes, handed) == (0, 0, 0)
    ok = run(_call(mw, headers={"Content-Length": "1000"}, chunks=[b"x" * 1000]))
    assert ok[0] == 200
    assert app.body_bytes == 1000


def test_streamed_oversized_body_stops_at_the_limit() -> None:
    """No Content-Length (chunked): the app gets at most the limit, the rest is never
    read from the client, and the answer is 413 even if the app turned the error into
    its own 400."""
    for app in (CountingApp(), CatchingApp()):
        mw = guarded(app, max_body_bytes=2500)
        status, _, body, handed = run(_call(mw, chunks=[b"x" * 1000] * 100))
        assert status == 413, body
        assert app.body_bytes <= 2500
        assert handed == 3  # the third chunk crossed the limit; 97 were never read


def test_unauthenticated_oversized_body_gets_401_not_413() -> None:
    app = CountingApp()
    mw = guarded(app, api_key=KEY, max_body_bytes=10)
    assert run(_call(mw, headers={"Content-Length": "100"}))[0] == 401


def test_concurrency_cap_answers_429_with_retry_after() -> None:
    app = CountingApp()
    app.gate = anyio.Event()
    mw = guarded(app, max_concurrent_requests=2, retry_after_seconds=3)
    results: list[tuple[int, dict[bytes, bytes], bytes, int]] = []

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            for _ in range(2):
                tg.start_soon(lambda: _collect(results, _call(mw)))
            with anyio.fail_after(5):
                while mw.in_flight < 2:  # noqa: ASYNC110 (waits for the two to enter)
                    await anyio.sleep(0.001)
            status, head, body, _ = await _call(mw)
            assert status == 429
            assert head[b"retry-after"] == b"3"
            assert b"limit of 2 requests" in body
            assert app.gate is not None
            app.gate.set()
        assert [r[0] for r in results] == [200, 200]
        assert mw.in_flight == 0
        assert (await _call(mw))[0] == 200

    anyio.run(main)


async def _collect(results: list[Any], coro: Any) -> None:
    results.append(await coro)


def test_health_is_not_counted_against_the_cap() -> None:
    app = CountingApp()
    mw = guarded(app, max_concurrent_requests=1)

    async def main() -> None:
        app.gate = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(_call, mw)
            with anyio.fail_after(5):
                while mw.in_flight < 1:  # noqa: ASYNC110
                    await anyio.sleep(0.001)
            assert (await _call(mw))[0] == 429
            probe = anyio.Event()

            async def health() -> None:
                assert (await _call(mw, "/health", method="GET"))[0] == 200
                probe.set()

            tg.start_soon(health)
            await anyio.sleep(0.01)
            assert not probe.is_set()  # the probe reached the app (waiting on its gate)
            app.gate.set()

    anyio.run(main)


def test_keys_never_show_in_repr() -> None:
    security = ServerSecurity(api_key=KEY, admin_api_key=ADMIN)
    assert KEY not in repr(security) and ADMIN not in repr(security)
    assert KEY not in str(security.describe())
    assert security.describe()["api_key_required"] is True


def test_resolve_key_prefers_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOME_KEY_ENV", "from-env")
    assert resolve_key(None, "SOME_KEY_ENV") == "from-env"
    assert resolve_key("flag", "SOME_KEY_ENV") == "flag"
    monkeypatch.setenv("SOME_KEY_ENV", "")
    assert resolve_key(None, "SOME_KEY_ENV") is None


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"])
def test_loopback_hosts(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.5", "example.org", ""])
def test_non_loopback_hosts(host: str) -> None:
    assert not is_loopback(host)


def test_bind_refused_without_a_key_unless_insecure(caplog: pytest.LogCaptureFixture) -> None:
    open_ = ServerSecurity()
    with pytest.raises(UserError, match=r"refusing to serve the sandbox on 0\.0\.0\.0"):
        check_bind("0.0.0.0", open_, insecure=False, server="the sandbox")
    # an admin key alone leaves ordinary endpoints open: still refused
    with pytest.raises(UserError):
        check_bind("0.0.0.0", ServerSecurity(admin_api_key=ADMIN), insecure=False, server="x")
    check_bind("127.0.0.1", open_, insecure=False, server="x")
    check_bind("0.0.0.0", ServerSecurity(api_key=KEY), insecure=False, server="x")
    assert not caplog.records
    with caplog.at_level(logging.WARNING, logger="toolrollout._security"):
        check_bind("0.0.0.0", open_, insecure=True, server="the sandbox")
    assert "WITHOUT an API key (--insecure)" in caplog.text


def test_servers_a_tool_starts_itself_get_no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    from toolrollout._security import keyless_environ

    monkeypatch.setenv("TOOLROLLOUT_API_KEY", KEY)
    monkeypatch.setenv("TOOLROLLOUT_ADMIN_API_KEY", ADMIN)
    env = keyless_environ()
    assert "TOOLROLLOUT_API_KEY" not in env and "TOOLROLLOUT_ADMIN_API_KEY" not in env
    assert env["PATH"] == __import__("os").environ["PATH"]
