"""Tool faults inside full rollouts: an MCP server in a crash loop, an overloaded sandbox,
a tool that hangs on every call. Each run must end in bounded time with every row
present, the failed calls marked on the rows, and no process left behind.

The engine is the scripted test seam (every trajectory calls the faulty tool on its first
two turns, then answers); the tools, their backends and the faults are real: the MCP
testkit server really exits mid-call, the sandbox endpoint really answers 503 over TCP,
the hanging coroutine is really cancelled.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
from tests.faults._proxy import FaultProxy
from tests.tools.mcp.mcp_helpers import child_pids

from toolrollout.engines import GenerateRequest
from toolrollout.rollout import RolloutConfig, RolloutRunner, Trajectory
from toolrollout.sandbox import sandbox_tool
from toolrollout.testing import ScriptedEngine, ScriptedOutput
from toolrollout.tools import (
    CircuitBreakerPolicy,
    RetryPolicy,
    Tool,
    ToolLimits,
    function_tool,
)
from toolrollout.tools.mcp import McpClientManager, list_mcp_tools
from toolrollout.tools.mcp._servers import StdioServer

# "show": these runs check that the faults reach the rows as tool errors the model reads;
# the default ("fail": the row fails unscored) is checked by test_default_policy_fails_rows.
CONFIG = RolloutConfig(n=2, max_turns=3, drift_check=False, tool_unavailable="show")
PROMPTS = [{"messages": [{"role": "user", "content": f"Task {i}"}]} for i in range(4)]


def calling_engine(tokenizer: Any, name: str, arguments: dict[str, Any]) -> ScriptedEngine:
    call = (
        f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n'
        "</tool_call><|im_end|>"
    )
    call_ids = tokenizer.encode(call, add_special_tokens=False)
    done_ids = tokenizer.encode("Done.<|im_end|>", add_special_tokens=False)

    def respond(request: GenerateRequest) -> ScriptedOutput:
        assert request.rid is not None
        turn = int(request.rid.rsplit("-", 2)[1][1:])
        out = call_ids if turn < 2 else done_ids
        return ScriptedOutput(out, logprobs=[-0.1] * len(out))

    return ScriptedEngine(respond)


def check_marked(results: list[Trajectory], error_text: str) -> list[str]:
    """All 8 rows, each completed with its two failed calls counted; returns the errors."""
    assert [(t.prompt_index, t.sample_index) for t in results] == [
        (p, s) for p in range(4) for s in range(2)
    ]
    errors: list[str] = []
    for t in results:
        assert t.status == "completed" and t.num_turns == 3, t.error
        assert t.num_tool_calls == 2 and t.tool_errors == 2
        tool_messages = [m["content"] for m in t.messages if m["role"] == "tool"]
        assert len(tool_messages) == 2
        errors += tool_messages
    assert all(error_text in e or "circuit" in e.lower() for e in errors), errors
    return errors


async def run(
    tokenizer: Any,
    tools: Sequence[Tool],
    name: str,
    args: dict[str, Any],
    config: RolloutConfig = CONFIG,
) -> Any:
    engine = calling_engine(tokenizer, name, args)
    runner = RolloutRunner(engine, tokenizer, tools, config=config)
    return await runner.run(PROMPTS)


def test_mcp_server_in_a_crash_loop(demo_tokenizer: Any, tmp_path: Path) -> None:
    before = child_pids()
    spec = StdioServer(
        name="testkit", command=sys.executable, args=("-m", "toolrollout.apps.mcp_servers.testkit")
    )
    limits = ToolLimits(
        timeout=30.0,
        retry=RetryPolicy(max_attempts=2, initial_backoff=0.0, jitter=0.0),
        circuit_breaker=CircuitBreakerPolicy(failure_threshold=3, reset_timeout=600.0),
    )

    async def main() -> tuple[list[Trajectory], dict[str, Any]]:
        async with McpClientManager([spec]) as manager:
            tools = await list_mcp_tools(manager, selected=["crash"], limits=limits)
            results = await run(demo_tokenizer, list(tools), "crash", {"exit_code": 3})
            counters = manager.statistics()["testkit"]
            return results, {"lost": counters.sessions_lost, "opened": counters.sessions_opened}

    started = time.monotonic()
    results, counters = anyio.run(main)
    assert time.monotonic() - started < 120
    errors = check_marked(results, "session was lost")
    # The breaker stopped the loop: the server was restarted a few times, not once per call.
    assert any("circuit" in e.lower() for e in errors)
    assert 1 <= counters["lost"] <= 6 and counters["opened"] <= 7
    assert child_pids() <= before  # every crashed server was reaped


def test_default_policy_fails_rows(demo_tokenizer: Any) -> None:
    """By default an unavailable sandbox fails every row, unscored, with its cause."""
    with FaultProxy(None, lambda k: "503", fault_path=b"/run_code") as proxy:
        tool = sandbox_tool(
            f"{proxy.url}/run_code",
            http_retries=2,
            retry_backoff=0.01,
            limits=ToolLimits(timeout=10.0, retry=RetryPolicy(max_attempts=1)),
        )
        config = RolloutConfig(n=2, max_turns=3, drift_check=False)
        results = anyio.run(run, demo_tokenizer, [tool], tool.name, {"code": "print(1)"}, config)
    assert len(results) == 8
    for t in results:
        assert t.status == "failed" and t.finish_reason == "tool_unavailable", t.error
        assert t.reward is None and t.num_turns == 1
        assert t.error is not None and f"tool {tool.name!r} unavailable" in t.error


def test_overloaded_sandbox(demo_tokenizer: Any) -> None:
    with FaultProxy(None, lambda k: "503", fault_path=b"/run_code") as proxy:
        tool = sandbox_tool(
            f"{proxy.url}/run_code",
            http_retries=2,
            retry_backoff=0.01,
            limits=ToolLimits(timeout=10.0, retry=RetryPolicy(max_attempts=1)),
        )
        started = time.monotonic()
        results = anyio.run(run, demo_tokenizer, [tool], tool.name, {"code": "print(1)"})
        elapsed = time.monotonic() - started
    assert elapsed < 30
    check_marked(results, "503")
    assert len(proxy.faults) == 16 * 3  # every call tried three times, then given up


def test_tool_hanging_on_every_call(demo_tokenizer: Any) -> None:
    cancelled: list[str] = []

    @function_tool(limits=ToolLimits(timeout=0.3, retry=RetryPolicy(max_attempts=1)))
    async def lookup(query: str) -> str:
        """Look something up (never answers).

        Args:
            query: what to look up.
        """
        try:
            await anyio.sleep_forever()
        finally:
            cancelled.append(query)
        return ""

    started = time.monotonic()
    results = anyio.run(run, demo_tokenizer, [lookup], "lookup", {"query": "x"})
    assert time.monotonic() - started < 10  # 16 calls, 0.3 s each, concurrently per turn
    check_marked(results, "timed out")
    assert len(cancelled) == 16  # each hung call was really cancelled, none left running
