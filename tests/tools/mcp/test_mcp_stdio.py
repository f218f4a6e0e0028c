"""The MCP backend against the project's testkit server over stdio: one shared session,
result conversion, timeouts cancelled on the server, reconnection, no orphan processes.

The tests of a healthy server share one server process (starting one costs seconds); the
manager is opened and closed by a host task, since a task group is entered and left by
the same task.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import anyio
import pytest
import pytest_asyncio
from mcp_helpers import child_pids, kit_stdio, pid_alive, read_log, wait_for

from toolrollout.tools import RetryPolicy, ToolCallRequest, ToolExecutor, ToolLimits, ToolResult
from toolrollout.tools.mcp import McpClientManager, McpTool, list_mcp_tools

NO_RETRY = ToolLimits(timeout=20.0, retry=RetryPolicy(max_attempts=1))
shared = pytest.mark.asyncio(loop_scope="module")


@dataclass
class Kit:
    manager: McpClientManager
    tools: dict[str, McpTool]
    log_dir: Path
    pid: int


async def server_stats(manager: McpClientManager, server: str = "testkit") -> dict[str, Any]:
    result = await manager.call_tool(server, "stats")
    assert isinstance(result.structured_content, dict)
    return result.structured_content


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def kit(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Kit]:
    log_dir = tmp_path_factory.mktemp("testkit")
    children = child_pids()
    manager = McpClientManager([kit_stdio(log_dir, rate=3)])
    opened = asyncio.Event()
    done = asyncio.Event()

    async def host() -> None:
        async with manager:
            await manager.connect()
            opened.set()
            await done.wait()

    host_task = asyncio.create_task(host())
    await asyncio.wait_for(opened.wait(), 60)
    tools = {t.name: t for t in await list_mcp_tools(manager, limits=NO_RETRY)}
    pid = (await server_stats(manager))["pid"]
    yield Kit(manager, tools, log_dir, pid)
    done.set()
    await host_task
    # aclose waited for the child to exit and be reaped: no orphan.
    assert not pid_alive(pid)
    assert child_pids() <= children
    assert not manager.is_open
    assert not manager.statistics()["testkit"].connected


@shared
async def test_one_session_is_shared_by_concurrent_calls(kit: Kit) -> None:
    manager = kit.manager
    assert {"echo", "stats", "hang", "image", "crash"} <= set(kit.tools)
    assert all(tool.manager is manager for tool in kit.tools.values())
    before = await server_stats(manager)
    executor = ToolExecutor([kit.tools["echo"]])
    calls = [ToolCallRequest("echo", {"text": f"call {i}"}) for i in range(40)]
    results = await executor.run_calls(calls)
    assert [r.text for r in results] == [f"call {i}" for i in range(40)]
    assert not any(r.is_error for r in results)
    assert executor.statistics().tools["echo"].max_running > 1, "calls ran concurrently"

    after = await server_stats(manager)
    assert after["initializes"] == 1, "every call must reuse the one session"
    assert after["pid"] == kit.pid
    assert after["calls"] - before["calls"] == 41
    counters = manager.statistics()["testkit"]
    assert (counters.sessions_opened, counters.connect_failures) == (1, 0)
    assert counters.connected and counters.in_flight == 0


@shared
async def test_results_are_converted(kit: Kit) -> None:
    executor = ToolExecutor(kit.tools.values())

    async def call(name: str, **arguments: Any) -> ToolResult:
        return await executor.run_call(ToolCallRequest(name, arguments))

    image = await call("image", width=5, height=4, color="blue")
    assert not image.is_error
    assert image.text == "a 5x4 blue image"
    (picture,) = image.images
    assert picture.size == (5, 4)
    assert picture.convert("RGB").getpixel((0, 0)) == (0, 0, 255)

    added = await call("add", a=2, b=3)
    assert (added.text, added.structured, added.is_error) == ("5", {"result": 5}, False)

    failed = await call("fail", message="broken on purpose")
    assert failed.is_error and failed.error_kind == "ToolExecutionError"
    assert "broken on purpose" in failed.text
    assert "broken on purpose" in str(failed.error)

    # Arguments are checked against the server's input schema before the call is sent.
    calls_before = kit.manager.statistics()["testkit"].calls
    bad_arguments = await call("add", a="two", b=3)
    assert bad_arguments.is_error and bad_arguments.error_kind == "ToolArgumentError"
    assert "'two' is not of type 'integer'" in bad_arguments.text
    assert kit.manager.statistics()["testkit"].calls == calls_before

    expected = {
        "empty": "",
        "audio": "[audio: audio/wav, 12 bytes]",
        "resource_text": "resource text",
        "resource_blob": "[resource file:///data.bin (application/octet-stream): 3 bytes]",
        "resource_link": "[resource link: doc <https://example.invalid/doc>]",
        "unicode": "tab\tnul\x00 émoji 🧪 \u202e",
    }
    for kind, text in expected.items():
        odd = await call("odd", kind=kind)
        assert (odd.text, odd.is_error, odd.images) == (text, False, ()), kind

    # An image nothing decodes is dropped with a note; the result is not an error.
    bad_image = await call("odd", kind="bad_image")
    assert not bad_image.is_error and bad_image.images == ()
    assert bad_image.text.startswith("[image dropped: ") and "base64" in bad_image.text

    # A response that breaks the tools/call result schema, on the wire itself...
    wire = await call("odd", kind="wire")
    assert wire.is_error and wire.error_kind == "ToolExecutionError"
    assert "malformed result" in wire.text
    # ... costs that call only: the session goes on.
    assert (await call("echo", text="still here")).text == "still here"
    assert kit.manager.statistics()["testkit"].sessions_opened == 1


@shared
async def test_timeout_cancels_the_call_on_the_server(kit: Kit) -> None:
    manager = kit.manager
    before = await server_stats(manager)
    hang = kit.tools["hang"].with_limits(replace(NO_RETRY, timeout=0.5))
    executor = ToolExecutor([hang, kit.tools["echo"]])

    result = await executor.run_call(ToolCallRequest("hang", {"tag": "t1"}))
    assert result.is_error and result.error_kind == "ToolTimeout"
    assert 0.5 <= result.seconds < 5
    # The handler on the server observed the cancellation (notifications/cancelled).
    await wait_for(lambda: "cancelled t1" in read_log(kit.log_dir))
    lines = [line for line in read_log(kit.log_dir) if line.endswith(" t1")]
    assert lines == ["started t1", "cancelled t1"]
    after = await server_stats(manager)
    assert after["cancellations"] - before["cancellations"] == 1
    # The session survives a cancelled call.
    echo = await executor.run_call(ToolCallRequest("echo", {"text": "after"}))
    assert echo.text == "after"
    assert manager.statistics()["testkit"].sessions_opened == 1


@shared
async def test_rate_limited_server_errors_are_recorded_and_retried(kit: Kit) -> None:
    manager = kit.manager
    (limited,) = await list_mcp_tools(manager, selected=["limited"], limits=NO_RETRY)
    failed_before = manager.statistics()["testkit"].failed_calls
    calls = [ToolCallRequest("limited", {})] * 6

    executor = ToolExecutor([limited])
    results = await executor.run_calls(calls)
    refused = [r for r in results if r.is_error]
    assert len(refused) == 3, "the server answers 3 calls per second"
    assert {r.error_kind for r in refused} == {"ToolUnavailable"}
    assert all("rate limited" in r.text for r in refused)
    assert executor.statistics().tools["limited"].errors == 3
    assert manager.statistics()["testkit"].failed_calls - failed_before == 3

    await anyio.sleep(1.0)  # a fresh window
    patient = limited.with_limits(
        replace(
            NO_RETRY,
            retry=RetryPolicy(max_attempts=9, initial_backoff=0.25, max_backoff=0.5, jitter=0.25),
        )
    )
    executor = ToolExecutor([patient])
    results = await executor.run_calls(calls)
    assert not any(r.is_error for r in results), [r.text for r in results]
    assert executor.statistics().tools["limited"].retries >= 3
    assert manager.statistics()["testkit"].sessions_opened == 1


@pytest.mark.usefixtures("no_orphans")
async def test_dead_server_errors_that_call_and_the_next_call_reconnects(tmp_path: Path) -> None:
    async with McpClientManager([kit_stdio(tmp_path)]) as manager:
        tools = {t.name: t for t in await list_mcp_tools(manager, limits=NO_RETRY)}
        executor = ToolExecutor(tools.values())
        first_pid = (await server_stats(manager))["pid"]

        # Killed mid-call: that call fails with ToolUnavailable (retries=0 here).
        results: list[ToolResult] = []

        async def hang() -> None:
            results.append(await executor.run_call(ToolCallRequest("hang", {"tag": "k1"})))

        async with anyio.create_task_group() as tg:
            tg.start_soon(hang)
            await wait_for(lambda: "started k1" in read_log(tmp_path))
            os.kill(first_pid, signal.SIGKILL)
        (killed,) = results
        assert killed.is_error and killed.error_kind == "ToolUnavailable"
        assert "session was lost" in killed.text
        await wait_for(lambda: not pid_alive(first_pid))  # reaped, not a zombie

        # The next call starts a new server by itself.
        echo = await executor.run_call(ToolCallRequest("echo", {"text": "back"}))
        assert (echo.text, echo.is_error) == ("back", False)
        second_pid = (await server_stats(manager))["pid"]
        assert second_pid != first_pid
        counters = manager.statistics()["testkit"]
        assert (counters.sessions_opened, counters.sessions_lost) == (2, 1)

        # Died while idle: noticed at once, so even a call without retries succeeds.
        os.kill(second_pid, signal.SIGKILL)
        await wait_for(lambda: not manager.statistics()["testkit"].connected)
        echo = await executor.run_call(ToolCallRequest("echo", {"text": "again"}))
        assert (echo.text, echo.is_error) == ("again", False)

        # Crashing mid-call, with one retry allowed: the retry runs on a new session.
        crash = tools["crash"].with_limits(
            replace(NO_RETRY, retry=RetryPolicy(max_attempts=2, initial_backoff=0.0, jitter=0.0))
        )
        executor = ToolExecutor([crash])
        marker = tmp_path / "crashed-once"
        result = await executor.run_call(ToolCallRequest("crash", {"once_marker": str(marker)}))
        assert (result.text, result.is_error) == ("survived: the marker exists", False)
        assert executor.statistics().tools["crash"].retries == 1
        counters = manager.statistics()["testkit"]
        assert (counters.sessions_opened, counters.sessions_lost) == (4, 3)
