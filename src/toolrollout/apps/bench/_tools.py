"""The benchmark's tool backend: an HTTP tool service in its own process.

``POST /call {"key": ...}`` answers a short text after the :class:`ToolLatency` drawn for
that key: a real round trip over loopback, as a search or sandbox tool costs, the same for
every driver (:class:`LookupClient`). ``POST /bench/draw`` counts the first turns of a
shared-prompt group (``Workload.grouped``) for all latency-model servers at once.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import Response

from toolrollout._exceptions import ToolRolloutError
from toolrollout._http import fast_transport

from ._model import ToolLatency
from ._script import TOOL_NAME

__all__ = ["LookupClient", "create_tool_app", "lookup_result", "main", "serve"]


def lookup_result(key: str) -> str:
    """The tool's answer for ``key`` (deterministic, a few tokens)."""
    value = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=2).digest(), "big")
    return f"record {key}: value {value}"


def _json(content: Any, status_code: int = 200) -> Response:
    return Response(
        json.dumps(content, separators=(",", ":")),
        status_code=status_code,
        media_type="application/json",
    )


def serve(app: Any, host: str, port: int) -> None:
    """Serve ``app`` as every benchmark service is served: quiet, with a deep backlog."""
    import uvicorn

    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        backlog=4096,
        timeout_keep_alive=30,
    )


def create_tool_app(latency: ToolLatency) -> Any:
    app = FastAPI(title="toolrollout benchmark tool service")
    calls: list[dict[str, Any]] = []
    drawn: dict[str, int] = {}

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.post("/call")
    async def call(request: Request) -> Response:
        body = json.loads(await request.body() or b"{}")
        key = body.get("key") if isinstance(body, dict) else None
        if not isinstance(key, str):
            return _json({"error": "key must be a string"}, 400)
        seconds = latency.sample(key)
        await asyncio.sleep(seconds)
        calls.append({"key": key, "seconds": seconds})
        return _json({"text": lookup_result(key)})

    @app.get("/bench/log")
    async def log() -> Response:
        return _json({"calls": calls})

    @app.post("/bench/draw")
    async def draw(request: Request) -> Response:
        """The next sample of a shared-prompt group, counted once for every server."""
        body = json.loads(await request.body() or b"{}")
        group, samples = body.get("group"), body.get("samples")
        if not isinstance(group, str) or not isinstance(samples, int) or samples < 1:
            error = "group must be a string and samples a positive int"
            return _json({"error": error}, 400)
        index = drawn.get(group, 0)
        drawn[group] = index + 1
        return _json({"index": index % samples})

    @app.post("/bench/reset")
    async def reset() -> Response:
        calls.clear()
        drawn.clear()
        return Response(status_code=200)

    return app


class LookupClient:
    """Client of the tool service, shared by all trajectories of one process."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self._client: httpx.AsyncClient | None = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            limits = httpx.Limits(max_connections=2048, max_keepalive_connections=16)
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(120.0, connect=10.0),
                limits=limits,
                transport=fast_transport(limits),  # as toolrollout's own long-lived clients
            )
        return self._client

    async def lookup(self, key: str) -> str:
        """Look up a record by its key.

        Args:
            key: the record key named in the task.
        """
        try:
            response = await self._http().post(f"{self.url}/call", json={"key": key})
            response.raise_for_status()
        except httpx.HTTPError as exc:
            raise ToolRolloutError(f"the lookup service failed: {exc}") from exc
        text = response.json().get("text")
        return str(text)

    def tool(self) -> Any:
        """The lookup as a toolrollout :class:`~toolrollout.tools.FunctionTool`."""
        from toolrollout.tools import FunctionTool

        return FunctionTool.from_function(self.lookup, name=TOOL_NAME)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m toolrollout.apps.bench.serve_tools``: serve the lookup tool with uvicorn."""
    parser = argparse.ArgumentParser(description="Benchmark tool service")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30100)
    for f in fields(ToolLatency):  # --latency-kind ... --latency-seed (ToolLatency.to_args)
        parser.add_argument(f"--latency-{f.name}", type=type(f.default), default=f.default)
    args = parser.parse_args(argv)
    latency = ToolLatency(
        **{f.name: getattr(args, f"latency_{f.name}") for f in fields(ToolLatency)}
    )
    serve(create_tool_app(latency), args.host, args.port)
