"""The app of ``toolrollout serve`` under uvicorn in a thread, on a loopback port.

For tests that need a real HTTP engine server but not a subprocess (which would spend most
of the test's time importing torch again).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn

from toolrollout._security import ServerSecurity
from toolrollout.apps.demo import DEMO_MODEL_PATH
from toolrollout.apps.server import create_app
from toolrollout.engines.embedded import EmbeddedEngine


@contextmanager
def demo_server_in_thread() -> Iterator[str]:
    """Serve the demo model one sequence at a time; yields the base URL."""
    engine = EmbeddedEngine(DEMO_MODEL_PATH, max_batch_size=1, num_threads=1)
    asyncio.run(engine.start())
    try:
        with serve_in_thread(engine) as url:
            yield url
    finally:
        asyncio.run(engine.aclose())


@contextmanager
def serve_in_thread(
    engine: EmbeddedEngine, *, security: ServerSecurity | None = None
) -> Iterator[str]:
    """Serve a started ``engine`` (left to the caller to close); yields the base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    uv = uvicorn.Server(uvicorn.Config(create_app(engine, security=security), log_level="warning"))
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not uv.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        uv.should_exit = True
        thread.join(10)
        sock.close()
