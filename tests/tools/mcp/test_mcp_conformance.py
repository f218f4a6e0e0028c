"""The MCP backend against servers others wrote: the MCP project's reference server
``@modelcontextprotocol/server-everything`` (npm) over stdio, SSE and streamable HTTP, and
the PyPI servers ``mcp-server-git`` and ``mcp-server-time``, each in its own virtualenv.

``.ci/mcp-servers.sh`` installs them (``.ci/run`` calls it; the ``installed`` fixture runs
it when something is missing). The server-everything tests skip only when ``node`` is not
installed. One server process per transport serves the module's shared manager; the
restart tests start their own.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
import pytest_asyncio
from mcp.client.session import ClientRequestContext
from mcp.types import (
    CreateMessageRequestParams,
    CreateMessageResult,
    ElicitRequestParams,
    ElicitResult,
    TextContent,
)
from mcp_helpers import REPO, child_pids, free_port, wait_for
from PIL import Image

from toolrollout.tools import (
    CircuitBreakerPolicy,
    RetryPolicy,
    ToolCallRequest,
    ToolExecutor,
    ToolLimits,
    load_tool_config,
    open_tools,
)
from toolrollout.tools.mcp import McpClientManager, McpRoot, McpTool, list_mcp_tools
from toolrollout.tools.mcp._servers import HttpServer, McpServerSpec, StdioServer

CI = REPO / ".ci"
EVERYTHING = CI / "node/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
VENVS = CI / "venvs"
NODE = shutil.which("node")
needs_node = pytest.mark.skipif(
    NODE is None, reason="node is not installed; server-everything is a node program"
)
shared = pytest.mark.asyncio(loop_scope="module")
TRANSPORTS = ("stdio", "sse", "http")
ROOT = McpRoot(uri="file:///srv/dataset", name="dataset")
NO_RETRY = ToolLimits(timeout=30.0, retry=RetryPolicy(max_attempts=1))


@pytest.fixture(scope="module")
def installed() -> None:
    """The third-party servers, installed by .ci/mcp-servers.sh if any is missing."""
    wanted = [EVERYTHING, VENVS / "git/bin/mcp-server-git", VENVS / "time/bin/mcp-server-time"]
    if NODE is None:
        wanted.remove(EVERYTHING)
    if not all(path.exists() for path in wanted):
        subprocess.run([str(CI / "mcp-servers.sh")], check=True, timeout=1200)


class NodeServer:
    """server-everything on an HTTP transport, on 127.0.0.1 at a fixed port (restartable)."""

    def __init__(self, transport: str) -> None:
        self.transport = transport  # "sse" or "streamableHttp", its CLI argument
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def spec(self) -> HttpServer:
        if self.transport == "sse":
            return HttpServer(name="sse", url=f"http://127.0.0.1:{self.port}/sse", transport="sse")
        return HttpServer(name="http", url=f"http://127.0.0.1:{self.port}/mcp")

    def start(self) -> None:
        assert NODE is not None
        self.process = subprocess.Popen(
            [NODE, str(EVERYTHING), self.transport],
            env={**os.environ, "PORT": str(self.port)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server-everything exited with {self.process.returncode}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"server-everything did not listen on {self.port}")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def stdio_everything(name: str = "stdio") -> StdioServer:
    assert NODE is not None
    return StdioServer(name=name, command=NODE, args=(str(EVERYTHING), "stdio"))


@contextlib.asynccontextmanager
async def hosted(manager: McpClientManager) -> AsyncIterator[McpClientManager]:
    """The manager, opened and closed by one host task (a task group's rule), in a
    module-scoped event loop where fixtures and tests run in different tasks."""
    opened = asyncio.Event()
    done = asyncio.Event()

    async def host() -> None:
        async with manager:
            opened.set()
            await done.wait()

    task = asyncio.create_task(host())
    await asyncio.wait_for(opened.wait(), 30)
    try:
        yield manager
    finally:
        done.set()
        await task


@dataclass
class Everything:
    manager: McpClientManager
    tools: dict[str, McpTool]
    """By model-facing name, ``<transport>_<tool>``."""


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def everything(installed: None) -> AsyncIterator[Everything]:
    if NODE is None:
        pytest.skip("node is not installed; server-everything is a node program")
    servers = [NodeServer("sse"), NodeServer("streamableHttp")]
    for server in servers:
        server.start()
    manager = McpClientManager(
        [stdio_everything(), *(server.spec for server in servers)],
        roots=[ROOT],
        progress_idle_timeout=2.0,
        heartbeat_interval=0.5,
    )
    try:
        async with hosted(manager):
            tools = await list_mcp_tools(manager, name_prefix="{server}_", limits=NO_RETRY)
            yield Everything(manager, {tool.name: tool for tool in tools})
    finally:
        for server in servers:
            server.kill()


async def call(env: Everything, transport: str, tool: str, **arguments: Any) -> Any:
    name = f"{transport}_{tool}"
    [result] = await ToolExecutor([env.tools[name]]).run_calls([ToolCallRequest(name, arguments)])
    return result


def tiny_image_png() -> bytes:
    """The PNG of server-everything's get-tiny-image, read from its source."""
    source = (EVERYTHING.parent / "tools/get-tiny-image.js").read_text(encoding="utf-8")
    match = re.search(r'MCP_TINY_IMAGE\s*=\s*"([^"]+)"', source)
    assert match is not None
    return base64.b64decode(match.group(1))


@needs_node
@shared
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_tool_list_keeps_metadata_and_leaves_out_task_required_tools(
    everything: Everything, transport: str, caplog: pytest.LogCaptureFixture
) -> None:
    names = {
        name.removeprefix(f"{transport}_")
        for name in everything.tools
        if name.startswith(f"{transport}_")
    }
    # server-everything registers some tools only for clients declaring a capability.
    # Roots are configured here, so roots are declared; no sampling or elicitation
    # callback is, so neither is declared and the tools needing them are not offered.
    assert {"echo", "get-tiny-image", "get-roots-list", "trigger-long-running-operation"} <= names
    assert not names & NEEDS_SAMPLING_OR_ELICITATION
    # simulate-research-query has execution.taskSupport "required": left out.
    listed = await everything.manager.list_tools(transport)
    assert any(
        info.name == "simulate-research-query"
        and info.execution is not None
        and info.execution.task_support == "required"
        for info in listed
    )
    assert "simulate-research-query" not in names
    weather = everything.tools[f"{transport}_get-structured-content"]
    assert weather.title == "Get Structured Content Tool"
    assert weather.annotations is not None and weather.annotations["readOnlyHint"] is True
    assert weather.output_schema is not None
    assert set(weather.output_schema["properties"]) == {"temperature", "conditions", "humidity"}


def test_task_required_tool_is_left_out_with_a_log_line(
    installed: None, caplog: pytest.LogCaptureFixture
) -> None:
    if NODE is None:
        pytest.skip("node is not installed; server-everything is a node program")

    async def run() -> list[str]:
        async with McpClientManager([stdio_everything()]) as manager:
            return [tool.name for tool in await list_mcp_tools(manager)]

    with caplog.at_level("WARNING", logger="toolrollout.tools.mcp"):
        names = anyio.run(run)
    assert "echo" in names and "simulate-research-query" not in names
    [line] = [r.getMessage() for r in caplog.records if "simulate-research-query" in r.getMessage()]
    assert "left out of the tool list" in line and "taskSupport: required" in line


@needs_node
@shared
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_image_with_a_bad_ancillary_checksum_is_decoded(
    everything: Everything, transport: str
) -> None:
    # Strict Pillow refuses the reference server's PNG (a metadata chunk's CRC is wrong)...
    with pytest.raises(OSError, match="cannot identify"):
        Image.open(io.BytesIO(tiny_image_png())).load()
    # ... and the result keeps the image and the text on both sides of it.
    result = await call(everything, transport, "get-tiny-image")
    assert not result.is_error, result.text
    assert result.text == "Here's the image you requested:\nThe image above is the MCP logo."
    [image] = result.images
    assert image.size == (20, 20)


@needs_node
@shared
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_structured_content_annotations_and_resources(
    everything: Everything, transport: str
) -> None:
    weather = await call(everything, transport, "get-structured-content", location="Chicago")
    assert not weather.is_error, weather.text
    assert weather.structured == {
        "temperature": 36,
        "conditions": "Light rain / drizzle",
        "humidity": 82,
    }
    assert json.loads(weather.text) == weather.structured

    text = await call(everything, transport, "get-resource-reference", resourceType="Text")
    lines = text.text.splitlines()
    assert lines[0] == "Returning resource reference for Resource 1:"
    assert lines[1].startswith("Resource 1: This is a plaintext resource")
    # A text/plain *blob* resource shows its text too, not a byte count.
    blob = await call(everything, transport, "get-resource-reference", resourceType="Blob")
    assert blob.text.splitlines()[1].startswith("Resource 1: This is a base64 blob")

    annotated = await call(
        everything, transport, "get-annotated-message", messageType="success", includeImage=True
    )
    assert annotated.text.startswith("Operation completed successfully")
    assert len(annotated.images) == 1


@needs_node
@shared
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_roots_are_answered(everything: Everything, transport: str) -> None:
    roots = await call(everything, transport, "get-roots-list")
    assert "Current MCP Roots (1 total)" in roots.text
    assert "dataset" in roots.text and "URI: file:///srv/dataset" in roots.text


NEEDS_SAMPLING_OR_ELICITATION = {
    "trigger-sampling-request",
    "trigger-sampling-request-async",
    "trigger-elicitation-request",
    "trigger-elicitation-request-async",
    "trigger-url-elicitation",
}
"""server-everything's tools that only a client declaring sampling or elicitation gets."""


@needs_node
async def test_only_configured_capabilities_are_declared(installed: None) -> None:
    async def sample(context: ClientRequestContext, params: CreateMessageRequestParams) -> Any:
        raise AssertionError("not called")

    async def elicit(context: ClientRequestContext, params: ElicitRequestParams) -> Any:
        raise AssertionError("not called")

    async def offered(**configured: Any) -> set[str]:
        async with McpClientManager([stdio_everything()], **configured) as manager:
            return {info.name for info in await manager.list_tools("stdio")}

    bare = await offered()
    assert "echo" in bare and not bare & {"get-roots-list", *NEEDS_SAMPLING_OR_ELICITATION}
    sampling = await offered(sampling_callback=sample)
    assert {"trigger-sampling-request"} <= sampling
    assert not sampling & {"get-roots-list", "trigger-elicitation-request"}
    elicitation = await offered(elicitation_callback=elicit)
    assert {"trigger-elicitation-request", "trigger-url-elicitation"} <= elicitation
    assert "trigger-sampling-request" not in elicitation
    assert "get-roots-list" in await offered(roots=[ROOT])


@needs_node
async def test_sampling_is_routed_to_a_configured_callback(installed: None) -> None:
    seen: list[str] = []

    async def engine(
        context: ClientRequestContext, params: CreateMessageRequestParams
    ) -> CreateMessageResult:
        content = params.messages[0].content
        seen.append(content.text if isinstance(content, TextContent) else "")
        return CreateMessageResult(
            role="assistant", content=TextContent(text="sampled: 42"), model="policy"
        )

    async with McpClientManager([stdio_everything()], sampling_callback=engine) as manager:
        result = await manager.call_tool(
            "stdio", "trigger-sampling-request", {"prompt": "six times seven", "maxTokens": 5}
        )
    assert not result.is_error
    assert seen == ["Resource trigger-sampling-request context: six times seven"]
    text = "\n".join(block.text for block in result.content if isinstance(block, TextContent))
    assert '"text": "sampled: 42"' in text and '"model": "policy"' in text


@needs_node
async def test_elicitation_is_routed_to_a_configured_callback(installed: None) -> None:
    asked: list[str] = []

    async def form(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        asked.append(params.message)
        return ElicitResult(action="accept", content={"name": "Ada Lovelace"})

    async with McpClientManager([stdio_everything()], elicitation_callback=form) as manager:
        result = await manager.call_tool("stdio", "trigger-elicitation-request")
    assert asked == ["Please provide inputs for the following fields:"]
    text = "\n".join(block.text for block in result.content if isinstance(block, TextContent))
    assert "User provided the requested information" in text and "Ada Lovelace" in text


@needs_node
@shared
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_progress_keeps_a_long_call_alive_within_its_timeout(
    everything: Everything, transport: str
) -> None:
    # 3 s in 6 steps: longer than the 2 s progress_idle_timeout, alive through progress.
    before = everything.manager.statistics()[transport].progress_notifications
    result = await call(
        everything, transport, "trigger-long-running-operation", duration=3, steps=6
    )
    assert not result.is_error, result.text
    assert result.text.startswith("Long running operation completed")
    assert everything.manager.statistics()[transport].progress_notifications - before == 6

    # One 4 s step: no progress for 2 s, so the idle timeout ends it as a timeout.
    started = time.monotonic()
    silent = await call(
        everything, transport, "trigger-long-running-operation", duration=4, steps=1
    )
    # (The per-call timeout is 30 s: only the idle timeout can end it this way.)
    assert silent.error_kind == "ToolTimeout" and "sent no progress for 2s" in silent.text
    assert time.monotonic() - started < 4.0

    # With progress flowing, the executor's per-call timeout still ends the call.
    name = f"{transport}_trigger-long-running-operation"
    tool = everything.tools[name].with_limits(ToolLimits(timeout=1.5, retry=RetryPolicy(1)))
    started = time.monotonic()
    [bounded] = await ToolExecutor([tool]).run_calls(
        [ToolCallRequest(name, {"duration": 10, "steps": 20})]
    )
    assert bounded.error_kind == "ToolTimeout" and "timed out after 1.5s" in bounded.text
    assert 1.4 < time.monotonic() - started < 8.0


def restart_limits() -> ToolLimits:
    """The default retries, and a breaker that opens on the first failed call."""
    return ToolLimits(
        timeout=20.0, circuit_breaker=CircuitBreakerPolicy(failure_threshold=1, reset_timeout=60)
    )


@contextlib.contextmanager
def node_server(transport: str) -> Iterator[NodeServer]:
    server = NodeServer(transport)
    server.start()
    try:
        yield server
    finally:
        server.kill()


def stdio_child(before: set[int]) -> int:
    [pid] = child_pids() - before
    return int(pid)


@needs_node
@pytest.mark.slow
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_server_restart_between_calls_is_survived(installed: None, transport: str) -> None:
    """Restart the server between two calls of one executor: the later calls succeed on a
    new session, the breaker (threshold 1) stays closed, nothing is reported as a tool
    error."""
    with contextlib.ExitStack() as stack:
        if transport == "stdio":
            spec: McpServerSpec = stdio_everything()
            server = None
        else:
            server = stack.enter_context(
                node_server("sse" if transport == "sse" else "streamableHttp")
            )
            spec = server.spec
        before = child_pids()
        async with McpClientManager([spec]) as manager:
            [tool] = [
                t.with_limits(restart_limits())
                for t in await list_mcp_tools(manager, selected=["echo"])
            ]
            executor = ToolExecutor([tool])
            first = await executor.run_call(ToolCallRequest("echo", {"message": "one"}))
            assert first.text == "Echo: one"
            started = time.monotonic()
            if server is None:  # stdio: the process dies; the manager starts a new one
                os.kill(stdio_child(before), signal.SIGKILL)
                await wait_for(lambda: not manager.statistics()[transport].connected)
            else:
                server.kill()
                server.start()  # same port, no memory of the old session
            later = await executor.run_calls(
                [ToolCallRequest("echo", {"message": f"after {i}"}) for i in range(5)]
            )
            elapsed = time.monotonic() - started
            assert [r.text for r in later] == [f"Echo: after {i}" for i in range(5)]
            assert not any(r.is_error for r in later)
            stats = executor.statistics().tools["echo"]
            assert stats.errors == 0
            assert stats.circuit_breaker is not None
            assert stats.circuit_breaker.state.value == "closed"
            assert stats.circuit_breaker.open_count == 0
            connection = manager.statistics()[transport]
            assert connection.sessions_lost == 1 and connection.sessions_opened == 2
            assert elapsed < 10, f"re-established in {elapsed:.1f}s"


@needs_node
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_in_flight_call_whose_server_died_is_unavailable(
    installed: None, transport: str
) -> None:
    """The server dies 1 s into a 10 s call with a short (5 s) timeout: the call fails as
    ToolUnavailable before the timeout, and a restarted server serves the next call."""
    with contextlib.ExitStack() as stack:
        if transport == "stdio":
            spec: McpServerSpec = stdio_everything()
            server = None
        else:
            server = stack.enter_context(
                node_server("sse" if transport == "sse" else "streamableHttp")
            )
            spec = server.spec
        before = child_pids()
        async with McpClientManager([spec], heartbeat_interval=0.5) as manager:
            [tool] = [
                t.with_limits(ToolLimits(timeout=5.0, retry=RetryPolicy(max_attempts=1)))
                for t in await list_mcp_tools(manager, selected=["trigger-long-running-operation"])
            ]
            executor = ToolExecutor([tool])

            async def kill_soon() -> None:
                await anyio.sleep(1.0)
                if server is None:
                    os.kill(stdio_child(before), signal.SIGKILL)
                else:
                    server.kill()

            started = time.monotonic()
            async with anyio.create_task_group() as tg:
                tg.start_soon(kill_soon)
                result = await executor.run_call(
                    ToolCallRequest("trigger-long-running-operation", {"duration": 10, "steps": 10})
                )
            elapsed = time.monotonic() - started
            assert result.error_kind == "ToolUnavailable", result.text
            assert elapsed < 5, f"reported after {elapsed:.1f}s"
            if server is not None:
                server.start()
            again = await executor.run_call(
                ToolCallRequest("trigger-long-running-operation", {"duration": 0.2, "steps": 1})
            )
            assert not again.is_error, again.text


@needs_node
@pytest.mark.parametrize("transport", ["sse", "http"])
async def test_in_flight_call_across_a_quick_restart_is_unavailable(
    installed: None, transport: str
) -> None:
    """The HTTP server is killed and started again on its port 1 s into a 20 s call (8 s
    timeout): the new server knows nothing of the session, and the call fails as
    ToolUnavailable (the SDK's stream resumption giving up, or the heartbeat ping answered
    with an error, whichever comes first), not as a timeout."""
    with node_server("sse" if transport == "sse" else "streamableHttp") as server:
        async with McpClientManager([server.spec], heartbeat_interval=0.5) as manager:
            [tool] = [
                t.with_limits(ToolLimits(timeout=8.0, retry=RetryPolicy(max_attempts=1)))
                for t in await list_mcp_tools(manager, selected=["trigger-long-running-operation"])
            ]
            executor = ToolExecutor([tool])

            async def restart_soon() -> None:
                await anyio.sleep(1.0)
                # Blocking the event loop on purpose: the new server is up before the
                # client sees the old stream end, as with a restart faster than the client.
                server.kill()
                server.start()

            started = time.monotonic()
            async with anyio.create_task_group() as tg:
                tg.start_soon(restart_soon)
                result = await executor.run_call(
                    ToolCallRequest("trigger-long-running-operation", {"duration": 20, "steps": 20})
                )
            assert result.error_kind == "ToolUnavailable", result.text
            assert time.monotonic() - started < 8.0
            again = await executor.run_call(
                ToolCallRequest("trigger-long-running-operation", {"duration": 0.2, "steps": 1})
            )
            assert not again.is_error, again.text


def make_repo(path: Path) -> Path:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
    }
    path.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main", str(path)], check=True, env=env)
    (path / "notes.txt").write_text("first line\n", encoding="utf-8")
    subprocess.run(["git", "-C", str(path), "add", "notes.txt"], check=True, env=env)
    subprocess.run(["git", "-C", str(path), "commit", "-q", "-m", "Add notes"], check=True, env=env)
    (path / "notes.txt").write_text("first line\nsecond line\n", encoding="utf-8")
    return path


@pytest.mark.slow
async def test_mcp_server_git_from_its_own_venv_via_config_files(
    installed: None, tmp_path: Path
) -> None:
    """mcp-server-git (the MCP project's git server, PyPI) in its own virtualenv, on a
    temporary repository, loaded from a tool config and an mcpServers file."""
    repo = make_repo(tmp_path / "repo")
    servers = {
        "mcpServers": {
            "git": {
                "command": str(VENVS / "git/bin/mcp-server-git"),
                "args": ["--repository", str(repo)],
            }
        }
    }
    (tmp_path / "servers.json").write_text(json.dumps(servers), encoding="utf-8")
    (tmp_path / "tools.yaml").write_text(
        "tools:\n"
        "  - class_name: toolrollout.tools.mcp.McpTool\n"
        "    config: {type: mcp, timeout: 30}\n"
        "    mcp:\n"
        "      mcp_servers_config_path: servers.json\n"
        "      tool_selected_list: [git_status, git_log, git_diff_unstaged, git_show]\n"
        "      roots: [repo]\n",
        encoding="utf-8",
    )
    tools = load_tool_config(tmp_path / "tools.yaml")
    assert [t.name for t in tools] == ["git_status", "git_diff_unstaged", "git_log", "git_show"]
    assert all(isinstance(t, McpTool) and t.manager.roots[0].uri == repo.as_uri() for t in tools)
    async with open_tools(tools):
        executor = ToolExecutor(tools)
        status, diff, log, outside, bogus = await executor.run_calls(
            [
                ToolCallRequest("git_status", {"repo_path": str(repo)}),
                ToolCallRequest("git_diff_unstaged", {"repo_path": str(repo)}),
                ToolCallRequest("git_log", {"repo_path": str(repo), "max_count": 5}),
                ToolCallRequest("git_status", {"repo_path": str(tmp_path)}),
                ToolCallRequest("git_show", {"repo_path": str(repo), "revision": "nope"}),
            ]
        )
    assert not status.is_error and "modified:   notes.txt" in status.text
    assert "+second line" in diff.text
    assert "Add notes" in log.text
    # The server's own refusals are answers (isError), not infrastructure failures.
    assert outside.is_error and outside.error_kind == "ToolExecutionError"
    assert "outside the allowed repository" in outside.text
    assert bogus.is_error and bogus.error_kind == "ToolExecutionError"


@pytest.mark.slow
async def test_mcp_server_time_from_its_own_venv_survives_a_crash(installed: None) -> None:
    """mcp-server-time in its own virtualenv: calls, then the process is killed between
    two calls and the next call runs on a new process."""
    spec = StdioServer(
        name="time",
        command=str(VENVS / "time/bin/mcp-server-time"),
        args=("--local-timezone", "UTC"),
    )
    before = child_pids()
    async with McpClientManager([spec]) as manager:
        tools = await list_mcp_tools(manager, limits=restart_limits())
        executor = ToolExecutor(tools)
        assert {t.name for t in tools} == {"get_current_time", "convert_time"}
        [paris] = await executor.run_calls(
            [ToolCallRequest("get_current_time", {"timezone": "Europe/Paris"})]
        )
        assert paris.structured is not None and paris.structured["timezone"] == "Europe/Paris"
        os.kill(stdio_child(before), signal.SIGKILL)
        await wait_for(lambda: not manager.statistics()["time"].connected)
        [tokyo] = await executor.run_calls(
            [ToolCallRequest("get_current_time", {"timezone": "Asia/Tokyo"})]
        )
        assert not tokyo.is_error and tokyo.structured is not None
        assert manager.statistics()["time"].sessions_opened == 2


@needs_node
@pytest.mark.slow
async def test_a_rollout_keeps_running_through_a_server_restart(installed: None) -> None:
    """Whole rollouts (four trajectories, two calls each) against server-everything over
    streamable HTTP, restarted between the first and the second call of every trajectory:
    every trajectory completes, every call returns the server's answer, nothing is lost or
    scored on an error (an unavailable call would fail the row: the default policy)."""
    from toolrollout.apps.demo import DEMO_MODEL_PATH
    from toolrollout.engines import GenerateRequest
    from toolrollout.rollout import RolloutConfig, RolloutRunner, TrajectoryStatus
    from toolrollout.spec import load_tokenizer
    from toolrollout.testing import ScriptedEngine, ScriptedOutput

    tokenizer = load_tokenizer(DEMO_MODEL_PATH)

    def ids(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    def call(message: str) -> list[int]:
        body = json.dumps({"name": "echo", "arguments": {"message": message}})
        return ids(f"<tool_call>\n{body}\n</tool_call><|im_end|>")

    with node_server("streamableHttp") as server:
        restarted: list[float] = []

        def respond(request: GenerateRequest) -> ScriptedOutput:
            assert request.rid is not None
            turn = int(request.rid.rsplit("-", 2)[1][1:])
            if turn == 1 and not restarted:  # the first second turn: the server goes away
                started = time.monotonic()
                server.kill()
                server.start()  # same port, no memory of the old sessions
                restarted.append(time.monotonic() - started)
            out = call(f"turn {turn}") if turn < 2 else ids("Done.<|im_end|>")
            return ScriptedOutput(out, logprobs=[-0.1] * len(out))

        async with McpClientManager([server.spec]) as manager:
            tools = [
                t.with_limits(restart_limits())
                for t in await list_mcp_tools(manager, selected=["echo"])
            ]
            runner = RolloutRunner(
                ScriptedEngine(respond), tokenizer, tools, config=RolloutConfig(n=2, max_turns=4)
            )
            prompts = [{"messages": [{"role": "user", "content": f"Echo {i}."}]} for i in range(2)]
            trajectories = await runner.run(prompts)
            lost = manager.statistics()["http"].sessions_lost
    assert restarted, "the scripted restart never happened"
    assert len(trajectories) == 4
    for t in trajectories:
        assert t.status is TrajectoryStatus.COMPLETED, t.error
        assert t.num_tool_calls == 2 and t.tool_errors == 0
        answers = [m["content"] for m in t.messages if m["role"] == "tool"]
        assert answers == ["Echo: turn 0", "Echo: turn 1"]
        assert t.metrics["drift_mismatches"] == 0
    assert lost >= 1  # the restart was seen, and ridden out


@needs_node
async def test_a_batch_target_cancels_a_reference_servers_long_call(installed: None) -> None:
    """Straggler control against server-everything: a 30 s ``trigger-long-running-operation``
    running when the batch target is met is cancelled (the batch is back in seconds), its
    trajectory ends aborted after its model turn, and the same stdio session serves the
    next call."""
    from transformers import AutoTokenizer

    from toolrollout.apps.demo import DEMO_MODEL_PATH
    from toolrollout.engines import GenerateRequest
    from toolrollout.rollout import RolloutConfig, RolloutRunner, TrajectoryStatus
    from toolrollout.testing import ScriptedEngine, ScriptedOutput

    tokenizer = AutoTokenizer.from_pretrained(str(DEMO_MODEL_PATH))
    name = "trigger-long-running-operation"
    call = json.dumps({"name": name, "arguments": {"duration": 30, "steps": 30}})

    def answer(text: str, delay: float = 0.0) -> ScriptedOutput:
        tokens = list(tokenizer.encode(text + "<|im_end|>", add_special_tokens=False))
        return ScriptedOutput(tokens, logprobs=[-0.5] * len(tokens), delay=delay)

    def script(request: GenerateRequest) -> ScriptedOutput:
        if request.session_id == "g1-0":  # g0 is 2 s into its call when g1 completes
            return answer("Done.", delay=2.0)
        return answer(f"<tool_call>\n{call}\n</tool_call>")

    prompt = [{"role": "user", "content": "Run the long operation."}]
    async with McpClientManager([stdio_everything()]) as manager:
        [tool] = [
            t.with_limits(ToolLimits(timeout=60.0, retry=RetryPolicy(max_attempts=1)))
            for t in await list_mcp_tools(manager, selected=[name])
        ]
        runner = RolloutRunner(ScriptedEngine(script), tokenizer, [tool], config=RolloutConfig())
        started = time.monotonic()
        with anyio.fail_after(25):  # the call alone takes 30 s
            batch = await runner.run_batch(
                [prompt, prompt], target_groups=1, group_ids=["g0", "g1"]
            )
        elapsed = time.monotonic() - started
        [partial] = batch.partial
        assert partial.uid == "g0-0" and partial.status is TrajectoryStatus.ABORTED
        assert "during its tool calls" in (partial.error or "")
        assert [s.kind for s in partial.spans] == ["model"] and partial.num_tool_calls == 0
        assert partial.metrics["tool_calls_cancelled"] == 1
        assert elapsed < 15, f"the batch came back after {elapsed:.1f}s"
        # the executor counts the call as cancelled, not as a finished call or an error
        stats = runner.tools.statistics().tools[name]
        assert (stats.cancelled, stats.calls, stats.errors, stats.in_flight) == (1, 0, 0, 0)
        # the server's session survived the cancelled request
        [after] = await ToolExecutor([tool]).run_calls(
            [ToolCallRequest(name, {"duration": 0.2, "steps": 1})]
        )
        assert not after.is_error, after.text
        assert after.text.startswith("Long running operation completed")
