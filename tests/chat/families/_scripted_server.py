"""A scripted SGLang stand-in over real HTTP, for the CLI and adapter runs of each family.

It answers SGLang's native ``/generate`` (token ids in, token ids and logprobs out) with
the next scripted turn, whatever the input, plus the health and info endpoints the client
reads. Only for tests whose model turns are known in advance (one trajectory at a time).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI, Request

__all__ = ["scripted_sglang_server"]


def _app(turns: Sequence[Sequence[int]], stop_ids: Sequence[int], log: list[Any]) -> FastAPI:
    app = FastAPI()
    pending = [list(turn) for turn in turns]

    @app.get("/health")
    @app.get("/health_generate")
    async def health() -> dict[str, str]:
        return {}

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info() -> dict[str, Any]:
        return {"model_path": "scripted", "is_generation": True, "weight_version": "default"}

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info() -> dict[str, Any]:
        return {"model_path": "scripted", "context_length": 32768, "weight_version": "default"}

    @app.post("/generate")
    async def generate(request: Request) -> dict[str, Any]:
        body = await request.json()
        log.append(body)
        ids = pending.pop(0) if pending else list(stop_ids[:1])
        stopped = bool(ids) and ids[-1] in stop_ids
        finish = (
            {"type": "stop", "matched": ids[-1]}
            if stopped
            else {"type": "length", "length": len(ids)}
        )
        return {
            "text": "",
            "output_ids": ids,
            "meta_info": {
                "id": body.get("rid") or "scripted",
                "finish_reason": finish,
                "prompt_tokens": len(body.get("input_ids") or []),
                "completion_tokens": len(ids),
                "cached_tokens": 0,
                "weight_version": "default",
                "output_token_logprobs": [[-0.5, token, None] for token in ids],
            },
        }

    return app


@contextmanager
def scripted_sglang_server(
    turns: Sequence[Sequence[int]], stop_ids: Sequence[int]
) -> Iterator[tuple[str, list[Any]]]:
    """Serve ``turns`` in order on a loopback port; yields the URL and the request log."""
    log: list[Any] = []
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(_app(turns, stop_ids, log), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("the scripted server did not start")
            time.sleep(0.02)
        yield f"http://127.0.0.1:{port}", log
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
