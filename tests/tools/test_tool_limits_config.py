"""Limit keys of the tool-config YAML: mapping onto ToolLimits, and errors naming file + key."""

from __future__ import annotations

import json
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from toolrollout._exceptions import (
    ConfigError,
    ToolExecutionError,
    ToolTimeout,
    ToolUnavailable,
)
from toolrollout.tools import (
    CircuitBreakerPolicy,
    RetryPolicy,
    ToolCallRequest,
    ToolExecutor,
    ToolLimits,
    load_tool_config,
)
from toolrollout.tools._types import DEFAULT_TOOL_RETRY

CALC = 'class_name: "toolrollout.tools.CalculatorTool"'


def write(tmp_path: Path, config: str) -> Path:
    path = tmp_path / "tools.yaml"
    body = textwrap.indent(textwrap.dedent(config).strip(), " " * 6)
    path.write_text(f"tools:\n  - {CALC}\n    config:\n{body}\n", encoding="utf-8")
    return path


def limits_of(tmp_path: Path, config: str) -> ToolLimits:
    [tool] = load_tool_config(write(tmp_path, config))
    return tool.limits


def test_every_limit_key(tmp_path: Path) -> None:
    limits = limits_of(
        tmp_path,
        """
        timeout: 5
        max_concurrency: 8
        rate_limit: 10
        rate_burst: 2
        retries:
          attempts: 4
          backoff: 0.5
          max_backoff: 4
          retry_on: [ToolUnavailable, TimeoutError, ToolTimeout, json.JSONDecodeError]
        circuit_breaker:
          failure_threshold: 3
          reset_timeout: 12.5
          trip_on: [ToolUnavailable, ToolTimeout]
        """,
    )
    assert limits == ToolLimits(
        timeout=5,
        max_concurrency=8,
        rate_limit=10,
        rate_burst=2,
        retry=RetryPolicy(
            max_attempts=4,
            initial_backoff=0.5,
            max_backoff=4,
            jitter=0.5,
            retry_on=(ToolUnavailable, TimeoutError, json.JSONDecodeError),
            retry_timeouts=True,
        ),
        circuit_breaker=CircuitBreakerPolicy(3, 12.5, (ToolUnavailable, ToolTimeout)),
    )


def test_existing_keys_keep_working(tmp_path: Path) -> None:
    assert limits_of(tmp_path, "num_workers: 4\nretries: 3") == ToolLimits(
        max_concurrency=4, retry=replace(DEFAULT_TOOL_RETRY, max_attempts=4)
    )
    long_form = limits_of(tmp_path, "retries: {retries: 1, backoff: 0.5, on_timeout: true}")
    assert long_form.retry == replace(
        DEFAULT_TOOL_RETRY, max_attempts=2, initial_backoff=0.5, jitter=0.5, retry_timeouts=True
    )
    assert long_form.circuit_breaker is None  # no breaker unless asked for


def test_unset_retry_keys_keep_the_tools_own_policy(tmp_path: Path) -> None:
    assert limits_of(tmp_path, "retries: {max_backoff: 9}").retry == replace(
        DEFAULT_TOOL_RETRY, max_backoff=9
    )


def test_circuit_breaker_switches(tmp_path: Path) -> None:
    assert limits_of(tmp_path, "circuit_breaker: true").circuit_breaker == CircuitBreakerPolicy()
    assert limits_of(tmp_path, "circuit_breaker: false").circuit_breaker is None
    defaults = limits_of(tmp_path, "circuit_breaker: {failure_threshold: 2}").circuit_breaker
    assert defaults == CircuitBreakerPolicy(failure_threshold=2)
    assert defaults.trip_on == (ToolUnavailable, ToolTimeout, ToolExecutionError)


async def test_the_config_limits_are_enforced(tmp_path: Path) -> None:
    path = write(tmp_path, "circuit_breaker: {failure_threshold: 1, reset_timeout: 60}")
    executor = ToolExecutor(load_tool_config(path))
    # a calculator error is the tool answering: it must not open the breaker
    for _ in range(3):
        result = await executor.run_call(ToolCallRequest("calculator", {"expression": "1/0"}))
        assert result.is_error and result.error_kind is None
    stats = executor.statistics().tools["calculator"].circuit_breaker
    assert stats is not None and stats.state == "closed" and stats.failure_threshold == 1


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            "circuit_breaker: {failure_threshold: 0}",
            "tools[0].config.circuit_breaker.failure_threshold: must be a positive number (got 0)",
        ),
        (
            "circuit_breaker: {reset_timeout: -1}",
            "tools[0].config.circuit_breaker.reset_timeout: must be a positive number (got -1)",
        ),
        (
            "circuit_breaker: {failure_treshold: 3}",
            "tools[0].config.circuit_breaker.failure_treshold: unknown key",
        ),
        (
            "circuit_breaker: {trip_on: [ToolUnavailable, ToolArgumentError]}",
            "tools[0].config.circuit_breaker.trip_on[1]: must be one of 'ToolUnavailable', "
            "'ToolTimeout' or 'ToolExecutionError' (got 'ToolArgumentError')",
        ),
        (
            "circuit_breaker: {trip_on: []}",
            "tools[0].config.circuit_breaker.trip_on: must name at least one error kind (got [])",
        ),
        ("circuit_breaker: 5", "tools[0].config.circuit_breaker: must be a mapping (got 5)"),
        (
            "retries: {retries: 1, attempts: 3}",
            "tools[0].config.retries: give either 'retries' or 'attempts', not both",
        ),
        (
            "retries: {attempts: 0}",
            "tools[0].config.retries.attempts: must be a positive number (got 0)",
        ),
        (
            "retries: {retry_on: [ConnectionError, Nope]}",
            "tools[0].config.retries.retry_on[1]: unknown error type: use one of",
        ),
        (
            "retries: {retry_on: [no_such_pkg.Error]}",
            "tools[0].config.retries.retry_on[0]: cannot import it: No module named 'no_such_pkg'",
        ),
        (
            "retries: {retry_on: [json.dumps]}",
            "tools[0].config.retries.retry_on[0]: is not an exception class (got 'json.dumps')",
        ),
        ("retries: {tries: 3}", "tools[0].config.retries.tries: unknown key"),
        ("rate_limit: 0", "tools[0].config.rate_limit: must be a positive number (got 0)"),
        ("rate_burst: 1.5", "tools[0].config.rate_burst: must be an integer (got 1.5)"),
        ("timeout: fast", "tools[0].config.timeout: must be a number (got 'fast')"),
    ],
)
def test_bad_keys_name_the_file_and_the_key_path(tmp_path: Path, config: str, message: str) -> None:
    path = write(tmp_path, config)
    with pytest.raises(ConfigError) as info:
        load_tool_config(path)
    text = str(info.value)
    assert text.startswith(f"{path}: {message}"), text
