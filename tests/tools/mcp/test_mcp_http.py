"""The MCP backend over streamable HTTP and SSE, against the project's own servers run as
subprocesses on free local ports; plus the shipped HTTP tool config."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from mcp_helpers import REPO, free_port, http_server, port_free, read_log, wait_for

from toolrollout.apps.mcp_servers.testkit import LOG_ENV
from toolrollout.tools import (
    RetryPolicy,
    ToolCallRequest,
    ToolExecutor,
    ToolLimits,
    load_tool_config,
)
from toolrollout.tools.mcp import McpClientManager, McpTool, list_mcp_tools, mcp_sessions
from toolrollout.tools.mcp._servers import HttpServer, parse_mcp_servers

NO_RETRY = ToolLimits(timeout=20.0, retry=RetryPolicy(max_attempts=1))


async def test_streamable_http_session_is_shared_and_survives_a_restart(tmp_path: Path) -> None:
    port = free_port()
    log = str(tmp_path / "testkit.log")
    with http_server("testkit", port=port, **{LOG_ENV: log}) as server:
        manager = McpClientManager([HttpServer(name="kit", url=f"http://127.0.0.1:{port}/mcp")])
        async with manager:
            tools = {t.name: t for t in await list_mcp_tools(manager, limits=NO_RETRY)}
            hang = tools["hang"].with_limits(replace(NO_RETRY, timeout=0.5))
            executor = ToolExecutor([tools["echo"], tools["stats"], hang])

            calls = [ToolCallRequest("echo", {"text": str(i)}) for i in range(20)]
            results = await executor.run_calls(calls)
            assert [r.text for r in results] == [str(i) for i in range(20)]
            stats = await executor.run_call(ToolCallRequest("stats", {}))
            assert stats.structured is not None
            assert stats.structured["initializes"] == 1
            assert stats.structured["calls"] == 21

            # A timed-out call is cancelled on the server over HTTP too.
            timed_out = await executor.run_call(ToolCallRequest("hang", {"tag": "h1"}))
            assert timed_out.error_kind == "ToolTimeout"
            await wait_for(lambda: "cancelled h1" in read_log(tmp_path))

            # The server restarts: its sessions are gone. The next call finds out ("Session
            # not found") and fails with ToolUnavailable (no retries here)...
            server.kill()
            server.start()
            failed = await executor.run_call(ToolCallRequest("echo", {"text": "lost"}))
            assert failed.is_error and failed.error_kind == "ToolUnavailable"
            assert "session was lost" in failed.text
            # ... and the call after it reconnects by itself (a retry would have, too).
            back = await executor.run_call(ToolCallRequest("echo", {"text": "back"}))
            assert (back.text, back.is_error) == ("back", False)
            counters = manager.statistics()["kit"]
            assert (counters.sessions_opened, counters.sessions_lost) == (2, 1)
            stats = await executor.run_call(ToolCallRequest("stats", {}))
            assert stats.structured is not None and stats.structured["initializes"] == 1


async def test_sse_transport_is_inferred_and_works(tmp_path: Path) -> None:
    port = free_port()
    log = str(tmp_path / "testkit.log")
    with http_server("testkit", "sse", port=port, **{LOG_ENV: log}):
        servers = parse_mcp_servers(
            {"mcpServers": {"kit": {"url": f"http://127.0.0.1:{port}/sse"}}}
        )
        assert isinstance(servers["kit"], HttpServer) and servers["kit"].transport == "sse"
        async with McpClientManager(servers) as manager:
            tools = {t.name: t for t in await list_mcp_tools(manager, limits=NO_RETRY)}
            hang = tools["hang"].with_limits(replace(NO_RETRY, timeout=0.5))
            executor = ToolExecutor([tools["echo"], tools["image"], hang])
            results = await executor.run_calls(
                [ToolCallRequest("echo", {"text": str(i)}) for i in range(10)]
                + [ToolCallRequest("image", {"width": 3, "height": 2})]
            )
            assert [r.text for r in results[:10]] == [str(i) for i in range(10)]
            assert results[10].images[0].size == (3, 2)
            timed_out = await executor.run_call(ToolCallRequest("hang", {"tag": "s1"}))
            assert timed_out.error_kind == "ToolTimeout"
            await wait_for(lambda: "cancelled s1" in read_log(tmp_path))


SHIPPED_HTTP_PORT = 8765


@pytest.mark.skipif(
    not port_free(SHIPPED_HTTP_PORT), reason=f"port {SHIPPED_HTTP_PORT} is in use here"
)
async def test_shipped_http_config_runs_the_calculator() -> None:
    with http_server("calculator", port=SHIPPED_HTTP_PORT):
        tools = load_tool_config(REPO / "tool_configs" / "mcp_http.yaml")
        assert [t.name for t in tools] == ["calculator"]
        assert isinstance(tools[0], McpTool) and tools[0].limits.timeout == 10
        async with mcp_sessions(tools) as managers:
            results = await ToolExecutor(tools).run_calls(
                [
                    ToolCallRequest("calculator", {"expression": "3 * (4 + 5)"}),
                    ToolCallRequest("calculator", {"expression": "1 / 0"}),
                ]
            )
            assert (results[0].text, results[0].is_error) == ("27", False)
            assert results[1].is_error and "division by zero" in results[1].text
            assert managers[0].statistics()["calculator"].sessions_opened == 1
        assert not managers[0].is_open
