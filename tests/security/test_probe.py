"""One black-box probe of every toolrollout server: ``toolrollout serve``, the sandbox, the
retriever and the gateway, each served by uvicorn on a loopback port and reached over raw
sockets, pass the same checks.

* **Keys**: an ordinary endpoint answers SGLang's 401 ``{"error": "Unauthorized"}`` without
  the key or with a wrong one, and not 401 with it; health stays open.
* **Size**: a body over the limit is answered 413 before it is read whole, whatever its
  framing: a large ``Content-Length`` (nothing of the body is sent), a chunked body, and a
  small ``Content-Length`` with a chunked body. The chunked bodies are never finished (no
  last chunk is sent), so an answer at all means the server stopped reading.
* **Caps**: the cap on requests at once counts a request before its body is read: with the
  cap's worth of requests waiting for their bodies, the next one gets 429.
* **Secrecy**: the key shows in no answer and no log line (uvicorn's access log included).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

KEY = "k-probe-0123456789abcdef"
LIMIT = 64 * 1024
CAP = 2


@dataclass(frozen=True)
class Target:
    """A server under the probe: how to build its guarded app, and one ordinary endpoint
    that reads a body (a small valid one for the key check)."""

    name: str
    app: Callable[[Path], AbstractAsyncContextManager[Any]]
    path: str
    body: dict[str, Any]
    health: str = "/health"


@asynccontextmanager
async def _serve_app(model: Path) -> AsyncIterator[Any]:
    from toolrollout.apps.server import create_app, default_security
    from toolrollout.engines.embedded import EmbeddedEngine

    engine = EmbeddedEngine(model, max_batch_size=2, num_threads=1)
    await engine.start()
    try:
        security = default_security(api_key=KEY, max_body_bytes=LIMIT, max_concurrent_requests=CAP)
        yield create_app(engine, security=security)
    finally:
        await engine.aclose()


@asynccontextmanager
async def _sandbox_app(model: Path) -> AsyncIterator[Any]:
    from toolrollout.sandbox._runner import SandboxRunner, SandboxServerConfig
    from toolrollout.sandbox._server import create_sandbox_app, sandbox_security

    runner = SandboxRunner(SandboxServerConfig(isolation="none", max_concurrency=1))
    security = sandbox_security(api_key=KEY, max_body_bytes=LIMIT, max_concurrent_requests=CAP)
    yield create_sandbox_app(runner, security=security)


@asynccontextmanager
async def _retriever_app(model: Path) -> AsyncIterator[Any]:
    from toolrollout.search import Bm25Retriever, load_corpus
    from toolrollout.search.demo_corpus import DEMO_CORPUS_PATH
    from toolrollout.search.retriever import create_retriever_app, retriever_security

    retriever = Bm25Retriever(load_corpus(DEMO_CORPUS_PATH))
    security = retriever_security(api_key=KEY, max_body_bytes=LIMIT, max_concurrent_requests=CAP)
    yield create_retriever_app(retriever, security=security)


@asynccontextmanager
async def _gateway_app(model: Path) -> AsyncIterator[Any]:
    from toolrollout.apps.demo import DEMO_MODEL_PATH
    from toolrollout.apps.gateway import Gateway, build_app, gateway_security
    from toolrollout.spec._policy import load_tokenizer
    from toolrollout.testing import ScriptedEngine, ScriptedOutput

    tokenizer = load_tokenizer(DEMO_MODEL_PATH)
    ids = tuple(tokenizer.encode("ok<|im_end|>", add_special_tokens=False))
    engine = ScriptedEngine(lambda request: ScriptedOutput(ids, logprobs=[-0.5] * len(ids)))
    async with Gateway(engine, tokenizer) as gateway:
        security = gateway_security(
            gateway, api_key=KEY, max_body_bytes=LIMIT, max_concurrent_requests=CAP
        )
        yield build_app(gateway, security=security)


TARGETS = {
    "serve": Target(
        "serve",
        _serve_app,
        "/generate",
        {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 1, "temperature": 0}},
    ),
    "sandbox": Target(
        "sandbox", _sandbox_app, "/run_code", {"code": "print(6 * 7)", "language": "python"}
    ),
    "retriever": Target(
        "retriever", _retriever_app, "/retrieve", {"queries": ["capital of France"], "topk": 1}
    ),
    "gateway": Target(
        "gateway",
        _gateway_app,
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    ),
}


@dataclass(frozen=True)
class Live:
    target: Target
    port: int


@pytest.fixture(scope="module", params=sorted(TARGETS))
def live(request: pytest.FixtureRequest, tiny_model_path: Path) -> Iterator[Live]:
    """The server on a loopback port, under uvicorn in a thread with its own event loop."""
    import uvicorn

    target = TARGETS[request.param]
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    box: dict[str, Any] = {}

    async def main() -> None:
        async with target.app(tiny_model_path) as app:
            config = uvicorn.Config(app, log_config=None, log_level="debug", access_log=True)
            box["server"] = server = uvicorn.Server(config)
            await server.serve(sockets=[sock])

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:  # reported by the fixture
            box["error"] = exc

    thread = threading.Thread(target=run, name=f"probe-{target.name}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not (box.get("server") and box["server"].started):
        if "error" in box or not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"{target.name} did not start: {box.get('error')!r}")
        time.sleep(0.02)
    try:
        yield Live(target, port)
    finally:
        box["server"].should_exit = True
        thread.join(30)
        sock.close()


# --- raw HTTP ---------------------------------------------------------------------------


def _head(live: Live, extra: str, *, key: str | None = KEY, method: str = "POST") -> bytes:
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    return (
        f"{method} {live.target.path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}"
        f"Content-Type: application/json\r\n{extra}\r\n"
    ).encode()


def _answer(conn: socket.socket, timeout: float = 20.0) -> tuple[int, bytes]:
    """The status and the bytes of the answer (headers and as much body as came)."""
    conn.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        more = conn.recv(65536)
        if not more:
            break
        data += more
    head, _, rest = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    conn.settimeout(2.0)
    while len(rest) < length:
        more = conn.recv(65536)
        if not more:
            break
        rest += more
    return int(head.split(b" ")[1]), head + b"\r\n\r\n" + rest


def _request(live: Live, body: bytes, *, key: str | None = KEY, method: str = "POST") -> Any:
    with socket.create_connection(("127.0.0.1", live.port)) as conn:
        conn.sendall(_head(live, f"Content-Length: {len(body)}\r\n", key=key, method=method))
        conn.sendall(body)
        return _answer(conn, timeout=60)


def _chunks(total: int, size: int = 8192) -> Iterator[bytes]:
    """Chunked framing of ``total`` bytes of (never finished) JSON, without the last chunk."""
    sent = 0
    piece = b'{"pad": "' + b"x" * size
    while sent < total:
        yield b"%x\r\n" % len(piece) + piece + b"\r\n"
        sent += len(piece)
        piece = b"x" * size


# --- the checks -----------------------------------------------------------------------


def test_ordinary_endpoints_need_the_key_and_health_stays_open(live: Live) -> None:
    body = json.dumps(live.target.body).encode()
    for key in (None, "wrong", KEY + "x"):
        status, raw = _request(live, body, key=key)
        assert status == 401, (live.target.name, key)
        assert raw.endswith(b'{"error":"Unauthorized"}') or b'"Unauthorized"' in raw
    status, _ = _request(live, body)
    assert status != 401 and status < 500, live.target.name
    with socket.create_connection(("127.0.0.1", live.port)) as conn:
        conn.sendall(f"GET {live.target.health} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert _answer(conn)[0] == 200


@pytest.mark.parametrize("framing", ["content-length", "chunked", "small-length-and-chunked"])
def test_a_large_body_is_refused_before_it_is_read(live: Live, framing: str) -> None:
    with socket.create_connection(("127.0.0.1", live.port)) as conn:
        if framing == "content-length":
            conn.sendall(_head(live, f"Content-Length: {200 * 1024 * 1024}\r\n"))  # no body
        else:
            small = "Content-Length: 10\r\n" if framing != "chunked" else ""
            conn.sendall(_head(live, f"{small}Transfer-Encoding: chunked\r\n"))
            for chunk in _chunks(LIMIT + 16 * 1024):
                conn.sendall(chunk)  # the body goes over the limit and is never finished
        status, raw = _answer(conn)
    # (uvicorn's h11 takes the chunked framing over a conflicting Content-Length.)
    assert status == 413, (live.target.name, raw[:300])
    assert str(LIMIT).encode() in raw


def test_the_cap_counts_requests_before_their_bodies(live: Live) -> None:
    """``CAP`` requests wait for bodies they never get; the next one is refused at once."""
    held = [socket.create_connection(("127.0.0.1", live.port)) for _ in range(CAP)]
    try:
        for conn in held:
            conn.sendall(_head(live, "Content-Length: 1000\r\n"))
        time.sleep(0.3)  # let the server take them in (the cap counts them from here)
        with socket.create_connection(("127.0.0.1", live.port)) as conn:
            conn.sendall(_head(live, "Content-Length: 1000\r\n"))  # its body is not sent
            status, raw = _answer(conn)
        assert status == 429, (live.target.name, raw[:300])
        assert b"retry-after: 1" in raw.lower()
    finally:
        for conn in held:
            conn.close()


def test_the_key_shows_in_no_answer_and_no_log(
    live: Live, caplog: pytest.LogCaptureFixture
) -> None:
    body = json.dumps(live.target.body).encode()
    with caplog.at_level(logging.DEBUG):
        answers = [_request(live, body, key=key)[1] for key in (KEY, "wrong-" + KEY, None)]
        with socket.create_connection(("127.0.0.1", live.port)) as conn:
            conn.sendall(f"GET {live.target.health} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            answers.append(_answer(conn)[1])
        time.sleep(0.2)  # the access log line of the last request
    assert caplog.records, "nothing was logged: the probe would see no leak"
    assert KEY not in caplog.text
    assert all(KEY.encode() not in answer for answer in answers)
