"""The Sandbox Fusion client tool: against the local server, and against recorded answers.

The replayed bodies are Sandbox Fusion's own examples (docs/docs/docs/get-started.mdx of
bytedance/SandboxFusion) and what its ``run_command_bare``/``parse_run_status`` produce
for timeouts and sandbox errors.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.sandbox._support import require_language

from toolrollout._exceptions import ToolTimeout
from toolrollout.exceptions import (
    ConfigError,
    ToolArgumentError,
    ToolExecutionError,
    ToolUnavailable,
)
from toolrollout.sandbox import RunCodeRequest, RunCodeResponse, SandboxTool, sandbox_tool
from toolrollout.sandbox._protocol import RunStatus
from toolrollout.sandbox._tool import format_run_code_response
from toolrollout.tools import ToolCallRequest, ToolContext, ToolExecutor, load_tool_config
from toolrollout.tools._config import tools_from_config

REPO = Path(__file__).resolve().parents[2]

# Sandbox Fusion's documented answer for print("Hello, world!").
SF_SUCCESS: dict[str, Any] = {
    "status": "Success",
    "message": "",
    "compile_result": None,
    "run_result": {
        "status": "Finished",
        "execution_time": 0.016735315322875977,
        "return_code": 0,
        "stdout": "Hello, world!\n",
        "stderr": "",
    },
    "executor_pod_name": None,
    "files": {},
}
# A timeout there: TimeLimitExceeded with no return code, and the run is Failed.
SF_TIMEOUT: dict[str, Any] = {
    "status": "Failed",
    "message": "",
    "compile_result": None,
    "run_result": {
        "status": "TimeLimitExceeded",
        "execution_time": 10.01,
        "return_code": None,
        "stdout": "partial\n",
        "stderr": "",
    },
    "executor_pod_name": "sandbox-7f9c",
    "files": {},
}
SF_SANDBOX_ERROR: dict[str, Any] = {
    "status": "SandboxError",
    "message": "exception on running code ...: [Errno 28] No space left on device None",
    "compile_result": None,
    "run_result": None,
    "executor_pod_name": None,
    "files": {},
}
SF_REQUEST_KEYS = {
    "compile_timeout",
    "run_timeout",
    "memory_limit_MB",
    "code",
    "stdin",
    "language",
    "files",
    "fetch_files",
}

Handler = Callable[[httpx.Request], httpx.Response]


def replay(*answers: httpx.Response | Exception, seen: list[httpx.Request] | None = None) -> Any:
    queue = list(answers)

    def handler(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        answer = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    return httpx.MockTransport(handler)


def mock_tool(*answers: httpx.Response | Exception, **options: Any) -> SandboxTool:
    options.setdefault("retry_backoff", 0.0)
    return sandbox_tool("http://sandbox.test:8080/run_code", transport=replay(*answers), **options)


async def call(tool: SandboxTool, **arguments: Any) -> Any:
    executor = ToolExecutor([tool])
    return await executor.run_call(ToolCallRequest(tool.name, arguments), ToolContext())


# --- against recorded Sandbox Fusion answers ------------------------------------------------


async def test_request_body_is_sandbox_fusions() -> None:
    seen: list[httpx.Request] = []
    tool = sandbox_tool(
        "http://sandbox.test:8080/run_code",
        transport=replay(httpx.Response(200, json=SF_SUCCESS), seen=seen),
        run_timeout=7,
        memory_limit_mb=512,
    )
    result = await call(tool, code="print('Hello, world!')")
    assert not result.is_error, result.text
    assert result.text == "Hello, world!"
    body = json.loads(seen[0].content)
    assert set(body) == SF_REQUEST_KEYS
    assert body["language"] == "python"
    assert body["run_timeout"] == 7 and body["compile_timeout"] == 7
    assert body["memory_limit_MB"] == 512
    assert seen[0].url == "http://sandbox.test:8080/run_code"
    assert result.metrics == {
        "timed_out": 0.0,
        "execution_time": 0.016735315322875977,
        "return_code": 0.0,
    }
    assert result.structured["status"] == "Success"


async def test_timeout_answer_is_shown_clearly() -> None:
    result = await call(mock_tool(httpx.Response(200, json=SF_TIMEOUT)), code="x", timeout=10)
    assert not result.is_error
    assert result.text == "partial\n[timed out after 10 s: the program was killed]"
    assert result.metrics["timed_out"] == 1.0


async def test_sandbox_error_raises_tool_execution_error() -> None:
    result = await call(mock_tool(httpx.Response(200, json=SF_SANDBOX_ERROR)), code="x")
    assert result.is_error
    assert isinstance(result.error, ToolExecutionError)
    assert "No space left on device" in result.text


async def test_transient_errors_are_retried() -> None:
    seen: list[httpx.Request] = []
    tool = sandbox_tool(
        "http://sandbox.test/run_code",
        transport=replay(
            httpx.ConnectError("refused"),
            httpx.Response(503, text="busy"),
            httpx.Response(200, json=SF_SUCCESS),
            seen=seen,
        ),
        retry_backoff=0.0,
    )
    result = await call(tool, code="print('Hello, world!')")
    assert result.text == "Hello, world!"
    assert len(seen) == 3


async def test_unreachable_sandbox_is_unavailable_after_the_retries() -> None:
    seen: list[httpx.Request] = []
    tool = sandbox_tool(
        "http://sandbox.test/run_code",
        transport=replay(httpx.ConnectError("refused"), seen=seen),
        retry_backoff=0.0,
        http_retries=2,
    )
    result = await call(tool, code="1")
    assert isinstance(result.error, ToolUnavailable)
    assert "after 3 attempt(s)" in result.text
    assert len(seen) == 3


@pytest.mark.parametrize(
    ("answer", "kind", "text"),
    [
        (httpx.Response(422, json={"detail": "bad"}), ToolExecutionError, "HTTP 422"),
        (httpx.Response(500, json={"detail": "x"}), ToolExecutionError, "HTTP 500"),
        (httpx.Response(200, text="<html>"), ToolExecutionError, "not a /run_code response"),
        (httpx.ReadTimeout("slow"), ToolTimeout, "did not answer within"),
    ],
)
async def test_failures_translate_into_the_exception_tree(
    answer: httpx.Response | Exception, kind: type[Exception], text: str
) -> None:
    result = await call(mock_tool(answer), code="1")
    assert isinstance(result.error, kind)
    assert text in result.text


@pytest.mark.parametrize(
    "arguments",
    [
        {},
        {"code": 1},
        {"code": "1", "timeout": -1},
        {"code": "1", "timeout": "soon"},
        {"code": "1", "language": "klingon"},
    ],
)
async def test_bad_arguments_are_the_models_fault(arguments: dict[str, Any]) -> None:
    result = await call(mock_tool(httpx.Response(200, json=SF_SUCCESS)), **arguments)
    assert isinstance(result.error, ToolArgumentError)


async def test_timeout_argument_is_clamped() -> None:
    seen: list[httpx.Request] = []
    tool = sandbox_tool(
        "http://sandbox.test/run_code",
        transport=replay(httpx.Response(200, json=SF_SUCCESS), seen=seen),
        max_timeout=20,
    )
    await call(tool, code="1", timeout=1000)
    assert json.loads(seen[0].content)["run_timeout"] == 20


def test_formatting() -> None:
    def fmt(run_result: dict[str, Any], **kw: Any) -> str:
        body = {**SF_SUCCESS, "run_result": {**SF_SUCCESS["run_result"], **run_result}}
        return format_run_code_response(RunCodeResponse.model_validate(body), **kw)

    assert fmt({"stdout": "", "stderr": ""}) == "[no output]"
    assert fmt({"stdout": "a\n", "stderr": "warn\n"}) == "a\n[stderr]\nwarn"
    assert fmt({"stdout": "", "stderr": "Trace\n", "return_code": 1}) == (
        "[stderr]\nTrace\n[exit status 1]"
    )
    clipped = fmt({"stdout": "a" * 50 + "b" * 50}, max_output_chars=20)
    assert clipped.startswith("a" * 10) and clipped.endswith("b" * 10)
    assert "[... 80 characters omitted ...]" in clipped
    compile_failed = RunCodeResponse.model_validate(
        {
            **SF_SUCCESS,
            "status": "Failed",
            "run_result": None,
            "compile_result": {"status": "Finished", "return_code": 1, "stderr": "error: x"},
        }
    )
    assert format_run_code_response(compile_failed) == (
        "[stderr]\nerror: x\n[compilation failed with exit status 1]"
    )


# --- tool configs ---------------------------------------------------------------------------


def test_the_shipped_config_loads() -> None:
    (tool,) = load_tool_config(REPO / "tool_configs" / "sandbox.yaml")
    assert isinstance(tool, SandboxTool)
    assert tool.name == "python"
    assert tool.url == "http://127.0.0.1:8080/run_code"
    assert tool.run_timeout == 10 and tool.max_timeout == 30
    assert tool.limits.max_concurrency == 8
    assert tool.local_sandbox


def test_verls_sandbox_fusion_config_loads_as_it_is() -> None:
    (tool,) = tools_from_config(
        {
            "tools": [
                {
                    "class_name": "verl.tools.sandbox_fusion_tools.SandboxFusionTool",
                    "config": {
                        "type": "native",
                        "sandbox_fusion_url": "https://sandbox.example/run_code",
                        "num_workers": 10,
                        "enable_global_rate_limit": True,
                        "default_timeout": 30,
                        "default_language": "python",
                        "memory_limit_mb": 1024,
                    },
                    "tool_schema": {
                        "type": "function",
                        "function": {
                            "name": "code_interpreter",
                            "description": "A tool for executing code.",
                            "parameters": {
                                "type": "object",
                                "properties": {"code": {"type": "string"}},
                                "required": ["code"],
                            },
                        },
                    },
                }
            ]
        }
    )
    assert isinstance(tool, SandboxTool)
    assert tool.name == "code_interpreter"
    assert tool.url == "https://sandbox.example/run_code"
    assert tool.run_timeout == 30 and tool.memory_limit_mb == 1024
    assert tool.limits.max_concurrency == 10


def test_bad_sandbox_config_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"x.yaml: .*config.default_timeout"):
        tools_from_config(
            {
                "tools": [
                    {
                        "class_name": "toolrollout.sandbox.SandboxTool",
                        "config": {"type": "sandbox", "default_timeout": 0},
                    }
                ]
            },
            source="x.yaml",
        )
    with pytest.raises(ConfigError, match=r"config\.sandbox_url: unknown key"):
        tools_from_config(
            {
                "tools": [
                    {
                        "class_name": "toolrollout.sandbox.SandboxTool",
                        "config": {"type": "sandbox", "sandbox_url": "http://x"},
                    }
                ]
            }
        )
    with pytest.raises(ConfigError, match="type 'sandbox' needs"):
        tools_from_config(
            {
                "tools": [
                    {
                        "class_name": "toolrollout.tools.CalculatorTool",
                        "config": {"type": "sandbox"},
                    }
                ]
            }
        )


def test_bash_tool_schema() -> None:
    tool = sandbox_tool(language="bash")
    assert tool.name == "bash"
    assert tool.schema()["function"]["parameters"]["required"] == ["code"]
    assert "bash" in tool.description


# --- against the local server ---------------------------------------------------------------


async def test_tool_against_the_local_server(sandbox_url: str) -> None:
    python = sandbox_tool(f"{sandbox_url}/run_code")
    bash = sandbox_tool(f"{sandbox_url}/run_code", language="bash")
    executor = ToolExecutor([python, bash])
    calls = [
        ToolCallRequest("python", {"code": "print(6 * 7)"}),
        ToolCallRequest("python", {"code": "import sys\nprint('oops', file=sys.stderr)\n1/0"}),
        ToolCallRequest("python", {"code": "while True: pass", "timeout": 1}),
        ToolCallRequest("bash", {"code": "echo $((6 * 7)); exit 4"}),
    ]
    ok, failed, slow, shell = await executor.run_calls(calls, ToolContext())
    assert ok.text == "42" and not ok.is_error
    assert failed.text.startswith("[stderr]\noops\nTraceback")
    assert failed.text.endswith("ZeroDivisionError: division by zero\n[exit status 1]")
    assert slow.text == "[timed out after 1 s: the program was killed]"
    assert shell.text == "42\n[exit status 4]"


async def test_compiled_language_tool_against_the_local_server(sandbox_url: str) -> None:
    require_language(sandbox_url, "cpp")
    tool = sandbox_tool(f"{sandbox_url}/run_code", language="cpp")
    assert tool.name == "code_interpreter" and "C++17" in tool.description
    ok = await tool.call({"code": '#include <cstdio>\nint main(){puts("42");}'}, ToolContext())
    assert ok.text == "42" and not ok.is_error
    broken = await tool.call({"code": "int main() { return x; }"}, ToolContext())
    assert not broken.is_error  # the program's fault: a normal result
    assert "was not declared in this scope" in broken.text
    assert broken.text.endswith("[compilation failed with exit status 1]")


async def test_run_code_returns_the_parsed_response(sandbox_url: str) -> None:
    tool = sandbox_tool(f"{sandbox_url}/run_code")
    response = await tool.run_code(
        RunCodeRequest(code="print(input())", language="python", stdin="echo")
    )
    assert response.status == RunStatus.Success
    assert response.run_result is not None and response.run_result.stdout == "echo\n"
