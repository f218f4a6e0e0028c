"""The gateway's own secrecy rules, beyond the checks every server passes (test_probe.py):
a harness's key (which may be a real provider's) is never a session's name, in the rows it
writes, the listings it serves or the lines it logs; what a session made is visible to it
alone (or to the admin key); the session endpoints are the admin key's when one is set.

The harnesses are the official ``openai`` and ``anthropic`` SDKs over a loopback socket.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anthropic
import anyio
import httpx
import openai
import pytest
import uvicorn

from toolrollout._security import ServerSecurity
from toolrollout.apps.demo import DEMO_MODEL_PATH
from toolrollout.apps.gateway import Gateway, build_app, gateway_security
from toolrollout.rollout import read_rows
from toolrollout.spec._policy import load_tokenizer
from toolrollout.testing import ScriptedEngine, ScriptedOutput

OPENAI_KEY = "sk-proj-provider-secret-0123456789"
ANTHROPIC_KEY = "sk-ant-provider-secret-9876543210"
ADMIN = "k-admin-for-the-trainer-42"
USER = "k-gateway-user-key-17"


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer(DEMO_MODEL_PATH)


def engine(tokenizer: Any) -> ScriptedEngine:
    ids = tuple(tokenizer.encode("The answer is 4.<|im_end|>", add_special_tokens=False))
    return ScriptedEngine(lambda request: ScriptedOutput(ids, logprobs=[-0.25] * len(ids)))


@asynccontextmanager
async def serving(gateway: Gateway, security: ServerSecurity | None = None) -> AsyncIterator[str]:
    """The gateway's app on a loopback port in this event loop, uvicorn logging at debug."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    app = build_app(gateway, security=security)
    config = uvicorn.Config(app, log_config=None, log_level="debug", access_log=True)
    server = uvicorn.Server(config)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(server.serve, [sock])
        for _ in range(2000):
            if server.started:
                break
            await anyio.sleep(0.01)
        try:
            yield f"http://127.0.0.1:{sock.getsockname()[1]}"
        finally:
            server.should_exit = True


def _every_file(folder: Path) -> bytes:
    """The bytes of everything the gateway left in ``folder`` (the output, any shard)."""
    return b"".join(p.read_bytes() for p in folder.rglob("*") if p.is_file())


async def test_no_harness_key_in_rows_listings_or_logs(
    tokenizer: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "sessions.parquet"
    scripted = engine(tokenizer)
    seen: list[str] = []
    ask = [{"role": "user", "content": "What is 2 + 2?"}]
    with caplog.at_level(logging.DEBUG):
        async with Gateway(scripted, tokenizer, out=out) as gateway:
            async with serving(gateway) as url:
                oa = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=OPENAI_KEY, max_retries=0)
                async with oa:
                    reply = await oa.chat.completions.create(model="m", messages=ask)  # type: ignore[arg-type]
                    stored = await oa.responses.create(model="m", input="What is 2 + 2?")
                an = anthropic.AsyncAnthropic(base_url=url, api_key=ANTHROPIC_KEY, max_retries=0)
                async with an:
                    await an.messages.create(model="m", max_tokens=16, messages=ask)  # type: ignore[arg-type]
                async with httpx.AsyncClient(base_url=url) as http:

                    async def listing(key: str) -> dict[str, Any]:
                        answer = await http.get("/v1/sessions", headers={"x-api-key": key})
                        seen.append(answer.text)
                        return dict(answer.json()["sessions"])

                    mine, theirs = await listing(OPENAI_KEY), await listing(ANTHROPIC_KEY)
                    assert len(mine) == len(theirs) == 1 and mine.keys() != theirs.keys()
                    assert (await listing("someone-else")) == {}
                    (name,) = mine
                    assert name.startswith("key-") and mine[name]["requests"] == 2
                    path = f"/v1/responses/{stored.id}"
                    other = await http.get(path, headers={"authorization": "Bearer someone-else"})
                    assert other.status_code == 404  # another session's is as if unknown
                    own = await http.get(path, headers={"authorization": f"Bearer {OPENAI_KEY}"})
                    assert own.status_code == 200 and own.json()["id"] == stored.id
                    seen.extend([other.text, own.text])
                    for session in (*mine, *theirs):
                        closed = await http.post(f"/v1/sessions/{session}/close", json={})
                        assert closed.status_code == 200
                        seen.append(closed.text)
        assert reply.choices[0].message.content == "The answer is 4."
    rows = read_rows(out)
    assert len(rows) == 3 and {r["group_id"] for r in rows} == {name, *theirs}
    files = _every_file(tmp_path)
    for key in (OPENAI_KEY, ANTHROPIC_KEY):
        assert key.encode() not in files, "a harness key was written to the output"
        assert key not in repr(rows)
        assert all(key not in text for text in seen)
        assert key not in caplog.text
        assert all(key != request.session_id for request in scripted.requests)
    assert "GET /v1/sessions" in caplog.text  # the access log was captured


async def test_the_admin_key_scores_closes_and_sees_every_session(tokenizer: Any) -> None:
    """With both keys: harnesses (the API key) run their sessions and read their own
    stored responses; only the admin key lists, scores and closes sessions."""
    async with Gateway(engine(tokenizer), tokenizer) as gateway:
        security = gateway_security(gateway, api_key=USER, admin_api_key=ADMIN)
        transport = httpx.ASGITransport(app=build_app(gateway, security=security))
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as http:
            user = {"authorization": f"Bearer {USER}"}
            admin = {"authorization": f"Bearer {ADMIN}"}
            body = {"model": "m", "input": "What is 2 + 2?"}
            made = await http.post("/s/a/v1/responses", json=body, headers=user)
            assert made.status_code == 200
            await http.post("/s/b/v1/responses", json=body, headers=user)
            response = f"/v1/responses/{made.json()['id']}"
            # the API key's own session is its header's; the gateway key names none
            assert (await http.get(response, headers=user)).status_code == 404
            session_a = {**user, "x-toolrollout-session": "a"}
            assert (await http.get(response, headers=session_a)).status_code == 200
            session_b = {**user, "x-toolrollout-session": "b"}
            assert (await http.get(response, headers=session_b)).status_code == 404
            every = (await http.get("/v1/sessions", headers=admin)).json()["sessions"]
            assert set(every) == {"a", "b"}
            assert (await http.get("/v1/sessions/b", headers=admin)).status_code == 200
            for path in ("/v1/sessions", "/v1/sessions/a", "/s/a/v1/sessions"):
                assert (await http.get(path, headers=session_a)).status_code == 401
            for path in ("/v1/sessions/a/reward", "/s/a/v1/sessions/a/reward"):
                refused = await http.post(path, json={"reward": 1.0}, headers=session_a)
                assert refused.status_code == 401 and refused.json() == {"error": "Unauthorized"}
            scored = await http.post("/v1/sessions/a/reward", json={"reward": 1.0}, headers=admin)
            assert scored.status_code == 200
            refused = await http.post("/v1/sessions/a/close", json={}, headers=session_a)
            assert refused.status_code == 401
            closed = await http.post("/v1/sessions/a/close", json={}, headers=admin)
            assert closed.status_code == 200 and closed.json()["rows"][0]["reward"] == 1.0
            assert (await http.get("/health")).status_code == 200
