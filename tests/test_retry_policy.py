"""One retry policy: the engine client and the tool executor count and wait the same way."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

import toolrollout.engines
import toolrollout.tools
from toolrollout._exceptions import EngineUnavailable, ToolUnavailable, UserError
from toolrollout._retry import RetryPolicy
from toolrollout.engines import ENGINE_RETRY, SGLangClient
from toolrollout.engines._types import GenerateRequest
from toolrollout.tools import (
    ToolCallRequest,
    ToolExecutor,
    ToolLimits,
    function_tool,
    load_tool_config,
)
from toolrollout.tools._types import DEFAULT_TOOL_RETRY


def test_engines_and_tools_export_the_same_type() -> None:
    assert toolrollout.engines.RetryPolicy is RetryPolicy
    assert toolrollout.tools.RetryPolicy is RetryPolicy


def test_max_attempts_counts_the_first_attempt() -> None:
    assert RetryPolicy(max_attempts=1).retries == 0
    assert RetryPolicy(max_attempts=4).retries == 3
    with pytest.raises(UserError, match="max_attempts must be >= 1"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(UserError, match="must not be negative"):
        RetryPolicy(jitter=-0.1)


def test_the_defaults_of_each_caller_are_kept() -> None:
    # the engine client's (issue 23): 60 s of retrying, at most 30 attempts, 0.5 s doubling,
    # waits capped at 4 s, read timeouts not retried
    engine = SGLangClient("http://e:1")._retry
    assert engine == ENGINE_RETRY
    assert (engine.max_attempts, engine.initial_backoff, engine.max_backoff) == (30, 0.5, 4.0)
    assert engine.budget_s == 60.0
    assert engine.jitter == 0.5 and not engine.retry_timeouts
    # a tool's: 2 retries of infrastructure errors only, 0.1 s doubling, 2 s cap
    assert ToolLimits().retry == DEFAULT_TOOL_RETRY
    assert (DEFAULT_TOOL_RETRY.max_attempts, DEFAULT_TOOL_RETRY.initial_backoff) == (3, 0.1)
    assert (DEFAULT_TOOL_RETRY.max_backoff, DEFAULT_TOOL_RETRY.jitter) == (2.0, 0.1)
    assert DEFAULT_TOOL_RETRY.retry_on == (ToolUnavailable, ConnectionError)
    assert not DEFAULT_TOOL_RETRY.retry_timeouts


def test_backoff_doubles_with_jitter_and_never_passes_the_cap() -> None:
    policy = RetryPolicy(initial_backoff=0.5, max_backoff=3.0, jitter=0.25)
    for _ in range(200):
        first, second, fourth = policy.backoff(1), policy.backoff(2), policy.backoff(4)
        assert 0.5 <= first <= 0.75
        assert 1.0 <= second <= 1.25
        assert fourth == 3.0  # 4 s + jitter, capped
    assert RetryPolicy(initial_backoff=0.2, jitter=0.0).backoff(3) == pytest.approx(0.8)


@pytest.mark.parametrize(
    ("yaml_retries", "attempts"),
    [("0", 1), ("2", 3), ("{retries: 4}", 5), ("{attempts: 4}", 4)],
)
def test_the_yaml_key_counts_retries_like_verl(
    tmp_path: Path, yaml_retries: str, attempts: int
) -> None:
    config = tmp_path / "tools.yaml"
    config.write_text(
        "tools:\n"
        '  - class_name: "toolrollout.tools.CalculatorTool"\n'
        f"    config: {{retries: {yaml_retries}}}\n"
    )
    [tool] = load_tool_config(config)
    assert tool.limits.retry.max_attempts == attempts
    assert tool.limits.retry.initial_backoff == DEFAULT_TOOL_RETRY.initial_backoff


NO_WAIT = RetryPolicy(max_attempts=3, initial_backoff=0.0, max_backoff=0.0, jitter=0.0)


async def test_a_tool_call_makes_max_attempts_attempts() -> None:
    calls = 0

    @function_tool(limits=ToolLimits(retry=NO_WAIT))
    async def down() -> str:
        nonlocal calls
        calls += 1
        raise ToolUnavailable("backend down")

    [result] = await ToolExecutor([down]).run_calls([ToolCallRequest("down", {})])
    assert result.is_error and result.error_kind == "ToolUnavailable"
    assert calls == result.attempts == NO_WAIT.max_attempts
    assert result.retries == NO_WAIT.retries


async def test_an_engine_request_makes_max_attempts_attempts() -> None:
    calls = 0

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return httpx.Response(503, json={"error": {"message": "overloaded"}})

    client = SGLangClient("http://e:1", transport=httpx.MockTransport(handler), retry=NO_WAIT)
    async with client:
        with pytest.raises(EngineUnavailable, match="gave up after 3 attempts"):
            await client.generate(GenerateRequest(input_ids=(1, 2)))
        stats = client.stats()
    assert calls == NO_WAIT.max_attempts
    assert stats.retries == NO_WAIT.retries
