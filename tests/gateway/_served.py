"""The demo model behind a real gateway on a loopback port, for the SDK tests.

One embedded engine (the bundled demo model) and one :class:`Gateway` are started per test
run, in a thread with its own event loop under uvicorn, so the official SDK clients reach
them over real HTTP exactly as a harness does. Each test uses its own session keys, closes
its sessions through the HTTP endpoint and reads the rows from ``gateway.records``.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from toolrollout.apps.demo import DEMO_MODEL_PATH
from toolrollout.apps.gateway import Gateway, GatewayConfig, build_app
from toolrollout.chat import ChatFormat
from toolrollout.rollout import Trajectory
from toolrollout.tools.calculator import CALCULATOR_TOOL, calculator

from .conftest import assert_token_exact

MODEL = "demo"
SYSTEM = "You are a helpful assistant."
"""The demo prompts' system message (the model was trained under it)."""
PROMPTS = ("Multiply 4 by 341.", "What is 17 + 25?", "Compute 9 * 13.", "What is 120 - 47?")
"""Calculator questions in the demo prompts' style."""

FUNCTION = CALCULATOR_TOOL["function"]
NAME: str = FUNCTION["name"]
DESCRIPTION: str = FUNCTION["description"]
PARAMETERS: dict[str, Any] = FUNCTION["parameters"]


def run_tool(name: str, arguments: str | dict[str, Any]) -> str:
    """The harness's own tool: the calculator, run on the client side."""
    assert name == NAME, name
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    return calculator(**args)


@dataclass
class Served:
    """A running gateway: its base URL (no ``/v1``) and the object, for its records."""

    url: str
    gateway: Gateway

    def session(self) -> str:
        return f"sdk-{uuid.uuid4().hex[:12]}"

    def close(self, session: str) -> list[Trajectory]:
        """Close ``session`` over HTTP and return its rows, each checked token-exact."""
        live = self.gateway.session(session)
        assert live is not None, f"no open session {session!r}"
        formats = [segment.chat for segment in live.segments]
        answer = httpx.post(f"{self.url}/v1/sessions/{session}/close", json={"reward": 1.0})
        answer.raise_for_status()
        rows = sorted(self.gateway.records(session), key=lambda r: r.sample_index)
        assert [r["uid"] for r in answer.json()["rows"]] == [r.uid for r in rows]
        for row in rows:
            check_row(row, formats[row.sample_index])
        return rows


def check_row(row: Trajectory, chat: ChatFormat) -> None:
    """Token-exact under the family's rule and against a fresh render of the row's final
    messages; the model's tokens alone carry loss mask 1 (everything the harness sent, and
    the prompt, 0), one model span per turn, with the engine's logprobs."""
    assert_token_exact(row, chat)
    model = [span for span in row.spans if span.kind == "model"]
    assert len(model) == row.num_turns > 0
    assert sum(row.loss_mask) == sum(len(span.ids) for span in model)
    assert row.reward == 1.0


_SERVED: Served | None = None


def _start() -> tuple[Served, threading.Thread, Any]:
    import uvicorn

    from toolrollout.engines.embedded import EmbeddedEngine
    from toolrollout.spec._policy import load_tokenizer

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    box: dict[str, Any] = {}

    async def main() -> None:
        engine = EmbeddedEngine(DEMO_MODEL_PATH, max_batch_size=8, num_threads=1)
        await engine.start()
        try:
            context = (await engine.info()).context_length
            tokenizer = load_tokenizer(DEMO_MODEL_PATH)
            config = GatewayConfig(model_name=MODEL, idle_timeout=None)
            async with Gateway(engine, tokenizer, config=config, context_length=context) as gw:
                server = uvicorn.Server(uvicorn.Config(build_app(gw), log_level="warning"))
                box["gateway"], box["server"] = gw, server
                await server.serve(sockets=[sock])
        finally:
            await engine.aclose()
            sock.close()

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:  # reported by the waiting test
            box["error"] = exc

    thread = threading.Thread(target=run, name="gateway-under-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not (box.get("server") and box["server"].started):
        if "error" in box or not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the gateway did not start: {box.get('error')!r}")
        time.sleep(0.02)
    return Served(f"http://127.0.0.1:{port}", box["gateway"]), thread, box["server"]


@pytest.fixture(name="served")
def served_fixture(request: pytest.FixtureRequest) -> Served:
    """The shared gateway (started on first use, stopped at the end of the test run)."""
    global _SERVED
    if _SERVED is None:
        found, thread, server = _start()

        def stop() -> None:
            global _SERVED
            server.should_exit = True
            thread.join(30)
            _SERVED = None

        request.session.addfinalizer(stop)
        _SERVED = found
    return _SERVED
