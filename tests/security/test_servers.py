"""Every toolrollout server with keys and limits: ``toolrollout serve``'s app, the sandbox
and the retriever, reached by the project's own clients (SGLangClient, SandboxTool,
SearchTool) over ASGI, and the CLIs' bind check.

"The app never receives an oversized body" is checked on the client side: the request body
is a generator, and the number of chunks the server pulled from it is counted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from toolrollout._exceptions import EngineRequestRejected, ToolExecutionError, UserError
from toolrollout.apps.server import create_app, default_security
from toolrollout.engines import SGLangClient
from toolrollout.engines._types import GenerateRequest, SamplingParams
from toolrollout.engines.embedded import EmbeddedEngine
from toolrollout.sandbox import SandboxTool
from toolrollout.sandbox._runner import SandboxRunner, SandboxServerConfig
from toolrollout.sandbox._server import create_sandbox_app, sandbox_security
from toolrollout.search import Bm25Retriever, SearchTool, load_corpus
from toolrollout.search.demo_corpus import DEMO_CORPUS_PATH
from toolrollout.search.retriever import create_retriever_app, retriever_security
from toolrollout.spec import RunSpec

KEY = "k-user-0123456789"
ADMIN = "k-admin-9876543210"
LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def engine(tiny_model_path: Path) -> Iterator[EmbeddedEngine]:
    eng = EmbeddedEngine(tiny_model_path, max_batch_size=4, num_threads=1)
    asyncio.run(eng.start())
    yield eng
    asyncio.run(eng.aclose())


@pytest.fixture(scope="module")
def weights_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("checkpoints")


@pytest.fixture
async def serve(engine: EmbeddedEngine, weights_dir: Path) -> AsyncIterator[httpx.AsyncClient]:
    security = default_security(api_key=KEY, admin_api_key=ADMIN, max_body_bytes=LIMIT)
    app = create_app(engine, security=security, weights_dirs=[weights_dir])
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        yield client


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


GENERATE = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 2, "temperature": 0}}


async def test_serve_needs_the_key_and_keeps_health_open(serve: httpx.AsyncClient) -> None:
    for headers in ({}, auth("wrong"), auth(ADMIN)):
        answer = await serve.post("/generate", json=GENERATE, headers=headers)
        assert answer.status_code == 401
        assert answer.json() == {"error": "Unauthorized"}
    assert (await serve.post("/generate", json=GENERATE, headers=auth(KEY))).status_code == 200
    assert (await serve.get("/health")).status_code == 200
    assert (await serve.get("/get_model_info")).status_code == 401


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/flush_cache", None),
        ("/abort_request", {"rid": "nothing"}),
        ("/pause_generation", {"mode": "abort"}),
        ("/continue_generation", {}),
        ("/update_weight_version", {"new_version": "v", "abort_all_requests": False}),
        ("/update_weights_from_disk", {"model_path": "/nowhere"}),
    ],
)
async def test_control_endpoints_need_the_admin_key(
    serve: httpx.AsyncClient, path: str, body: dict[str, Any] | None
) -> None:
    answer = await serve.post(path, json=body, headers=auth(KEY))  # the user key
    assert answer.status_code == 401
    assert answer.json() == {"error": "Unauthorized"}
    assert (await serve.post(path, json=body)).status_code == 401
    assert (await serve.post(path, json=body, headers=auth(ADMIN))).status_code != 401


async def test_weights_only_from_the_allowed_folders(
    serve: httpx.AsyncClient, engine: EmbeddedEngine, weights_dir: Path, tmp_path: Path
) -> None:
    version = engine.weight_version
    for outside in (tmp_path / "model", weights_dir / ".." / "elsewhere", Path("/etc")):
        answer = await serve.post(
            "/update_weights_from_disk", json={"model_path": str(outside)}, headers=auth(ADMIN)
        )
        assert answer.status_code == 400
        assert answer.json()["success"] is False
        assert "outside the folders" in answer.json()["message"]
    link = weights_dir / "link"  # a symlink out of the folder is outside too
    link.symlink_to(tmp_path)
    answer = await serve.post(
        "/update_weights_from_disk", json={"model_path": str(link)}, headers=auth(ADMIN)
    )
    assert "outside the folders" in answer.json()["message"]
    # inside: the path is checked as a model folder (and this one is missing)
    inside = weights_dir / "step-1"
    answer = await serve.post(
        "/update_weights_from_disk", json={"model_path": str(inside)}, headers=auth(ADMIN)
    )
    assert answer.status_code == 400
    assert "outside the folders" not in answer.json()["message"]
    assert engine.weight_version == version


async def test_sglang_client_sends_its_key(engine: EmbeddedEngine) -> None:
    spec = RunSpec(engine_urls=("http://t",), engine_api_key=KEY)
    assert KEY not in repr(spec)
    app = create_app(engine, security=default_security(api_key=KEY))
    request = GenerateRequest(
        input_ids=(5, 6), sampling=SamplingParams(max_new_tokens=1, temperature=0.0)
    )
    transport = httpx.ASGITransport(app=app)
    async with SGLangClient("http://t", transport=transport, **spec.client_options()) as client:
        assert (await client.generate(request)).output_ids
    async with SGLangClient("http://t", transport=httpx.ASGITransport(app=app)) as client:
        with pytest.raises(EngineRequestRejected) as info:
            await client.generate(request)
    assert info.value.status_code == 401
    assert KEY not in str(info.value)


async def test_serve_refuses_oversized_bodies_before_reading_them(
    serve: httpx.AsyncClient,
) -> None:
    big = json.dumps({"input_ids": [7] * 200_000}).encode()
    assert len(big) > LIMIT
    answer = await serve.post("/generate", content=big, headers=auth(KEY))
    assert answer.status_code == 413
    assert str(LIMIT) in answer.json()["message"]
    pulled = 0

    async def chunks() -> AsyncIterator[bytes]:
        nonlocal pulled
        for start in range(0, len(big), 8192):
            pulled += 1
            yield big[start : start + 8192]

    answer = await serve.post("/generate", content=chunks(), headers=auth(KEY))
    assert answer.status_code == 413
    assert pulled <= LIMIT // 8192 + 2  # what fits, the chunk that crossed, and no more
    assert pulled < len(big) // 8192


async def test_server_info_and_logs_hold_no_key(
    serve: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG):
        info = await serve.get("/server_info", headers=auth(KEY))
        await serve.post("/generate", json=GENERATE, headers=auth("wrong-" + KEY))
        await serve.post("/flush_cache", headers=auth(KEY))
    assert info.status_code == 200
    assert KEY not in info.text and ADMIN not in info.text
    assert KEY not in caplog.text and ADMIN not in caplog.text


# --- the sandbox ---------------------------------------------------------------------


@pytest.fixture
def sandbox_app() -> Any:
    runner = SandboxRunner(SandboxServerConfig(isolation="none", max_concurrency=1))
    return create_sandbox_app(runner, security=sandbox_security(api_key=KEY, max_body_bytes=LIMIT))


async def test_sandbox_needs_the_key(sandbox_app: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    transport = httpx.ASGITransport(app=sandbox_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://s") as http:
        body = {"code": "print(6 * 7)", "language": "python"}
        assert (await http.post("/run_code", json=body)).status_code == 401
        assert (await http.post("/run_code", json=body, headers=auth("nope"))).status_code == 401
        assert (await http.get("/v1/ping")).text == '"pong"'  # probes stay open
        health = await http.get("/health")
        assert health.status_code == 200 and health.json() == {"status": "ok"}  # no more
        assert (await http.get("/server_info")).status_code == 401  # the host's details
        info = (await http.get("/server_info", headers=auth(KEY))).json()
        assert info["isolation"] == "none" and info["python"]
        big = {"code": "#" * (LIMIT + 1), "language": "python"}
        assert (await http.post("/run_code", json=big, headers=auth(KEY))).status_code == 413
    monkeypatch.setenv("TEST_SANDBOX_KEY", KEY)
    tool = SandboxTool.from_config({"url": "http://s/run_code", "api_key": "${TEST_SANDBOX_KEY}"})
    assert isinstance(tool, SandboxTool)
    assert KEY not in repr(tool)
    tool = dataclasses.replace(tool, transport=transport)
    response = await tool.run_code(tool_request("print(6 * 7)"))
    assert response.run_result is not None and response.run_result.stdout == "42\n"
    keyless = dataclasses.replace(tool, api_key=None)
    with pytest.raises(ToolExecutionError, match="401") as info:
        await keyless.run_code(tool_request("print(1)"))
    assert KEY not in str(info.value)


def tool_request(code: str) -> Any:
    from toolrollout.sandbox import RunCodeRequest

    return RunCodeRequest(code=code, language="python")


def test_a_config_key_names_an_unset_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    with pytest.raises(UserError, match="NO_SUCH_KEY_VAR is not set"):
        SandboxTool.from_config({"api_key": "${NO_SUCH_KEY_VAR}"})
    with pytest.raises(UserError, match="NO_SUCH_KEY_VAR is not set"):
        SearchTool.from_config(
            {"retrieval_service_url": "http://r/retrieve", "api_key": "${env:NO_SUCH_KEY_VAR}"}
        )


# --- the retriever -------------------------------------------------------------------


async def test_retriever_needs_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    retriever = Bm25Retriever(load_corpus(DEMO_CORPUS_PATH))
    app = create_retriever_app(
        retriever, security=retriever_security(api_key=KEY, max_body_bytes=LIMIT)
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://r") as http:
        body = {"queries": ["capital of France"], "topk": 1}
        assert (await http.post("/retrieve", json=body)).status_code == 401
        assert (await http.get("/health")).status_code == 200
        big = {"queries": ["x" * 1000] * 100}
        assert (await http.post("/retrieve", json=big, headers=auth(KEY))).status_code == 413
    monkeypatch.setenv("TEST_RETRIEVER_KEY", KEY)
    tool = SearchTool.from_config(
        {"retrieval_service_url": "http://r/retrieve", "api_key": "${TEST_RETRIEVER_KEY}"}
    )
    assert KEY not in repr(tool)
    tool = dataclasses.replace(tool, transport=transport)
    hits, _ = await tool.search(["capital of France"])
    assert hits[0]
    with pytest.raises(ToolExecutionError, match="401"):
        await dataclasses.replace(tool, api_key=None).search(["France"])


# --- the CLIs' bind check ------------------------------------------------------------


def _cli(args: list[str], env: dict[str, str] | None = None) -> Any:
    from toolrollout.apps.cli import app

    return CliRunner().invoke(app, args, env=env)


@pytest.mark.parametrize(
    "command",
    [
        ["serve"],
        ["sandbox", "serve", "--unsafe-no-isolation"],
        ["retriever", "serve"],
        ["gateway"],
    ],
)
def test_every_server_refuses_a_public_host_without_a_key(
    command: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TOOLROLLOUT_API_KEY", raising=False)
    result = _cli([*command, "--host", "0.0.0.0"])
    assert result.exit_code == 2, result.output
    assert "refusing to serve" in result.output and "--insecure" in result.output


@pytest.mark.parametrize(
    "command",
    [["sandbox", "serve", "--unsafe-no-isolation"], ["retriever", "serve"]],
)
def test_insecure_or_a_key_lets_it_start(
    command: list[str], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import uvicorn

    served: list[dict[str, Any]] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: served.append(kw))
    monkeypatch.delenv("TOOLROLLOUT_API_KEY", raising=False)
    with caplog.at_level(logging.WARNING, logger="toolrollout._security"):
        result = _cli([*command, "--host", "0.0.0.0", "--insecure"])
    assert result.exit_code == 0, result.output
    assert "WITHOUT an API key (--insecure)" in caplog.text
    caplog.clear()
    result = _cli([*command, "--host", "0.0.0.0"], env={"TOOLROLLOUT_API_KEY": KEY})
    assert result.exit_code == 0, result.output
    assert [s["host"] for s in served] == ["0.0.0.0", "0.0.0.0"]
    assert KEY not in result.output and KEY not in caplog.text


def test_the_gateway_starts_with_insecure_or_a_key(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """As the other servers: --insecure starts it open with a warning, a key from the
    environment starts it guarded (the key reaches its security, not its output)."""
    import toolrollout.apps.cli.gateway as gateway_cli

    served: list[tuple[str, Any]] = []

    def serve(spec: Any, config: Any, security: Any, host: str, *rest: Any) -> dict[str, int]:
        served.append((host, security))
        return {"sessions": 0, "rows_written": 0}

    monkeypatch.setattr(gateway_cli, "_serve", serve)
    monkeypatch.delenv("TOOLROLLOUT_API_KEY", raising=False)
    with caplog.at_level(logging.WARNING, logger="toolrollout._security"):
        result = _cli(["gateway", "--host", "0.0.0.0", "--insecure"])
    assert result.exit_code == 0, result.output
    assert "the gateway: serving on 0.0.0.0 WITHOUT an API key (--insecure)" in caplog.text
    caplog.clear()
    env = {"TOOLROLLOUT_API_KEY": KEY, "TOOLROLLOUT_ADMIN_API_KEY": ADMIN}
    result = _cli(["gateway", "--host", "0.0.0.0", "--max-body-mb", "1"], env=env)
    assert result.exit_code == 0, result.output
    (_, open_one), (host, guarded) = served
    assert open_one.api_key is None and host == "0.0.0.0"
    assert (guarded.api_key, guarded.admin_api_key) == (KEY, ADMIN)
    assert guarded.max_body_bytes == 1024 * 1024
    assert KEY not in result.output and KEY not in caplog.text


def test_serve_with_a_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import toolrollout.apps.server

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(toolrollout.apps.server, "run_server", lambda *a, **kw: calls.append(kw))
    env = {"TOOLROLLOUT_API_KEY": KEY, "TOOLROLLOUT_ADMIN_API_KEY": ADMIN}
    result = _cli(["serve", "--host", "0.0.0.0", "--weights-dir", "/tmp"], env=env)
    assert result.exit_code == 0, result.output
    (call,) = calls
    security = call["security"]
    assert (security.api_key, security.admin_api_key) == (KEY, ADMIN)
    assert call["weights_dirs"] == (Path("/tmp"),)
    assert KEY not in result.output


def test_an_mcp_http_server_takes_an_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    from toolrollout.tools.mcp._servers import HttpServer, parse_mcp_servers

    monkeypatch.setenv("TEST_MCP_KEY", KEY)
    servers = parse_mcp_servers(
        {
            "mcpServers": {
                "remote": {"url": "http://127.0.0.1:1/mcp", "api_key": "${env:TEST_MCP_KEY}"}
            }
        }
    )
    remote = servers["remote"]
    assert isinstance(remote, HttpServer)
    assert remote.headers == {"Authorization": f"Bearer {KEY}"}
    assert KEY not in repr(remote)


async def test_sandbox_caps_hold_whatever_the_request_asks() -> None:
    """A request asking for more time, memory or output than the server's options gets
    the server's caps (the server's options are the ceiling; a request can only lower
    them)."""
    config = SandboxServerConfig(
        isolation="none", max_concurrency=1, max_run_timeout=1.0, memory_limit_mb=256,
        max_output_bytes=1000,
    )  # fmt: skip
    app = create_sandbox_app(SandboxRunner(config), security=sandbox_security(api_key=KEY))
    greedy = {"language": "python", "run_timeout": 1000, "memory_limit_MB": 100_000}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://s", timeout=60) as http:

        async def run(code: str) -> dict[str, Any]:
            answer = await http.post("/run_code", json={**greedy, "code": code}, headers=auth(KEY))
            assert answer.status_code == 200
            return dict(answer.json()["run_result"])

        slow = await run("import time\ntime.sleep(30)")
        assert slow["status"] == "TimeLimitExceeded"
        assert slow["execution_time"] < 10
        big = await run("x = bytearray(512 * 1024 * 1024)\nprint('allocated')")
        assert "MemoryError" in big["stderr"]
        loud = await run("print('y' * 100_000)")
        kept, _, note = loud["stdout"].partition("\n[truncated:")
        assert len(kept.encode()) <= 1000 and "more bytes not shown" in note
