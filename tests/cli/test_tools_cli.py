"""`toolrollout tools list|call`: check a tool config with no model running."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from toolrollout.apps.cli import app
from toolrollout.tools.calculator import CALCULATOR_TOOL

REPO = Path(__file__).resolve().parents[2]

# Tools a config can name as `test_cli_tools_helpers:<function>` (module written below).
HELPERS = '''
import anyio
from toolrollout.tools import ToolResult


def picture(caption: str) -> ToolResult:
    """Return a caption and two images."""
    return ToolResult(text=f"[{caption}]", images=(b"png-1", b"png-2"))


async def stuck() -> str:
    """Never answers in time."""
    await anyio.sleep(10)
    return "late"


def crash(x: int) -> int:
    """Raises."""
    raise ValueError(f"cannot handle {x}")
'''

CONFIG = """\
tools:
  - class_name: "toolrollout.tools.CalculatorTool"
    config: {timeout: 5, max_concurrency: 8, rate_limit: 20, rate_burst: 2,
             circuit_breaker: {failure_threshold: 3, reset_timeout: 30}}
  - class_name: "test_cli_tools_helpers:picture"
  - class_name: "test_cli_tools_helpers:stuck"
    config: {timeout: 0.05, retries: 0}
  - class_name: "test_cli_tools_helpers:crash"
    config: {retries: 0}
  - class_name: "verl.tools.gsm8k_tool.Gsm8kTool"
"""


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    (tmp_path / "test_cli_tools_helpers.py").write_text(HELPERS, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "tools.yaml"
    path.write_text(CONFIG, encoding="utf-8")
    yield path
    sys.modules.pop("test_cli_tools_helpers", None)


def tools(*args: str) -> Result:
    return CliRunner(env={"COLUMNS": "120"}).invoke(app, ["tools", *args])


def assert_user_error(result: Result, message: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert result.stderr.startswith(f"error: {message}"), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


class TestList:
    def test_default_is_the_builtin_calculator(self) -> None:
        result = tools("list", "--json")
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout) == [CALCULATOR_TOOL]

    def test_table_with_limits_then_the_schemas(self, config: Path) -> None:
        result = tools("list", "--tool-config", str(config))
        assert result.exit_code == 0, result.output
        table, _, schemas = result.stdout.partition("\n[\n")
        names = [s["function"]["name"] for s in json.loads("[\n" + schemas)]
        assert names == ["calculator", "picture", "stuck", "crash", "calc_gsm8k_reward"]
        for expected in (
            "5 tool(s) from",
            "expression*",
            "timeout 5s",
            "concurrency 8",
            "rate 20/s, burst 2",
            "retries 2 on ToolUnavailable, ConnectionError",
            "open after 3 failures",
            "timeout 0.05s",
            "retries 0",
            "circuit breaker none",
        ):
            assert expected in table, (expected, table)

    def test_the_schemas_match_what_the_executor_gives_the_model(self, config: Path) -> None:
        from toolrollout.tools import ToolExecutor, load_tool_config

        result = tools("list", "--json", "--tool-config", str(config))
        assert json.loads(result.stdout) == ToolExecutor(load_tool_config(config)).schemas()


class TestCall:
    def test_prints_the_tool_message_text_exactly(self) -> None:
        result = tools("call", "calculator", "--args", '{"expression": "3 * (4 + 5)"}')
        assert result.exit_code == 0, result.output
        assert result.stdout == "27\n"
        for expected in ("status: ok", "error kind: -", "images: 0", "attempts: 1"):
            assert expected in result.stderr, result.stderr

    def test_an_error_result_is_printed_as_the_model_sees_it_and_exits_1(self) -> None:
        result = tools("call", "calculator", "--args", '{"expression": "1/0"}')
        assert result.exit_code == 1
        assert result.stdout == "Error: division by zero\n"
        assert "error kind: ToolReportedError" in result.stderr

    def test_arguments_failing_the_schema_are_the_models_error(self) -> None:
        result = tools("call", "calculator", "--args", '{"expression": 3}')
        assert result.exit_code == 1
        assert result.stdout.startswith("Error: invalid arguments for tool 'calculator'")
        assert "error kind: ToolArgumentError" in result.stderr
        assert "attempts: 0" in result.stderr

    def test_images_timeouts_and_crashes_from_a_config(self, config: Path) -> None:
        cfg = ("--tool-config", str(config))
        picture = tools("call", "picture", "--args", '{"caption": "cat"}', *cfg)
        assert (picture.exit_code, picture.stdout) == (0, "[cat]\n")
        assert "images: 2" in picture.stderr

        stuck = tools("call", "stuck", *cfg)
        assert stuck.exit_code == 1
        assert stuck.stdout == "Error: tool 'stuck' timed out after 0.05s\n"
        assert "error kind: ToolTimeout" in stuck.stderr

        crash = tools("call", "crash", "--args", '{"x": 7}', *cfg)
        assert crash.exit_code == 1
        assert crash.stdout == "Error: tool 'crash' raised ValueError: cannot handle 7\n"
        assert "error kind: ToolExecutionError" in crash.stderr
        assert "cause: ValueError: cannot handle 7" in crash.stderr
        assert "Traceback" not in crash.stderr  # the log stays quiet without --verbose
        verbose = tools("call", "crash", "--args", '{"x": 7}', "--verbose", *cfg)
        assert "Traceback" in verbose.stderr

    def test_ground_truth_reaches_the_tool(self, config: Path) -> None:
        result = tools(
            "call",
            "calc_gsm8k_reward",
            "--args",
            '{"answer": "72"}',
            "--ground-truth",
            "72",
            "--tool-config",
            str(config),
        )
        assert result.exit_code == 0, result.output
        assert result.stdout == "Current parsed answer='72' reward=1.0\n"
        assert "reward: 0" in result.stderr and '"answer_reward": 1.0' in result.stderr


class TestUserMistakes:
    def test_missing_config_file(self, tmp_path: Path) -> None:
        missing = tmp_path / "nope.yaml"
        assert_user_error(tools("list", "--tool-config", str(missing)), "tool config not found")
        assert_user_error(
            tools("call", "calculator", "--tool-config", str(missing)), "tool config not found"
        )

    def test_invalid_config_names_the_file_and_key(self, tmp_path: Path) -> None:
        path = tmp_path / "bad.yaml"
        path.write_text(
            textwrap.dedent(
                """\
                tools:
                  - class_name: toolrollout.tools.CalculatorTool
                    config: {circuit_breaker: {failure_threshold: 0}}
                """
            )
        )
        assert_user_error(
            tools("list", "--tool-config", str(path)),
            f"{path}: tools[0].config.circuit_breaker.failure_threshold: must be a positive",
        )

    @pytest.mark.parametrize(
        ("args", "message"),
        [
            ("{", "--args is not valid JSON: Expecting property name enclosed in double quotes"),
            ("[1, 2]", "--args must be a JSON object, got list"),
            ("", "--args is not valid JSON"),
        ],
    )
    def test_bad_json_arguments(self, args: str, message: str) -> None:
        assert_user_error(tools("call", "calculator", "--args", args), message)

    def test_unknown_tool(self) -> None:
        assert_user_error(tools("call", "calc"), "unknown tool 'calc'; available: calculator")


def test_the_installed_command_runs_it() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "toolrollout",
            "tools",
            "call",
            "calculator",
            "--args",
            '{"expression": "2**10"}',
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert (proc.returncode, proc.stdout) == (0, "1024\n"), proc.stderr
