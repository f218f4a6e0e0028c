"""A fault-injecting HTTP proxy for engine tests (the documented seam for network faults).

It sits between :class:`~toolrollout.engines.SGLangClient` and a real server and, per
``POST /generate`` (or another ``fault_path``, e.g. a sandbox's ``/run_code``), either
forwards the exchange or injects one real network fault:

* ``"503"``: answers ``503 Service Unavailable`` itself (a burst of 5xx);
* ``"hang"``: reads the request and never answers (a hung server);
* ``"reset"``: closes the socket with ``SO_LINGER`` 0, so the client gets a TCP RST;
* ``"truncate"``: forwards, then sends the headers and only half of the body before
  closing (a truncated body);
* ``"pass"``: forwards the exchange untouched.

Every other path (``/health``, ``/server_info``...) is forwarded. Each exchange uses its
own connection (``Connection: close``), so one fault never leaks into the next request.
The proxy runs its own event loop in a daemon thread, like a separate process would.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections.abc import Callable
from typing import Self

Plan = Callable[[int], str]
"""Maps the index of a faultable request (0, 1, 2...) to the fault to inject."""


class FaultProxy:
    def __init__(
        self, upstream_port: int | None, plan: Plan, *, fault_path: bytes = b"/generate"
    ) -> None:
        self.upstream_port = upstream_port
        self.plan = plan
        self.fault_path = fault_path
        self.faults: list[str] = []
        """The action taken for each faultable request, in arrival order."""
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Self:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self._loop
        ).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: object) -> None:
        async def shutdown() -> None:
            assert self._server is not None
            self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value.strip())
            body = await reader.readexactly(length) if length else b""
            action = "pass"
            if head.startswith(b"POST " + self.fault_path + b" "):
                with self._lock:
                    action = self.plan(len(self.faults))
                    self.faults.append(action)
            await self._act(action, head, body, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _act(
        self,
        action: str,
        head: bytes,
        body: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        if action == "503":
            payload = b'{"error": {"message": "injected overload", "code": 503}}'
            writer.write(
                b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(payload)
                + payload
            )
            await writer.drain()
        elif action == "hang":
            await reader.read()  # until the client gives up and closes
        elif action == "reset":
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        elif action in ("pass", "truncate"):
            response = await self._forward(head, body)
            if action == "truncate":
                split = response.index(b"\r\n\r\n") + 4
                cut = split + max((len(response) - split) // 2, 1)
                response = response[:cut]
            writer.write(response)
            await writer.drain()
        else:
            raise ValueError(f"unknown fault {action!r}")

    async def _forward(self, head: bytes, body: bytes) -> bytes:
        if self.upstream_port is None:
            raise ConnectionError("no upstream")
        lines = [
            line
            for line in head.rstrip(b"\r\n").split(b"\r\n")
            if not line.lower().startswith(b"connection:")
        ]
        request = b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n" + body
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        try:
            up_writer.write(request)
            await up_writer.drain()
            return await up_reader.read()
        finally:
            up_writer.close()
