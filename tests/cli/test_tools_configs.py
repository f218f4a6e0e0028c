"""Every shipped tool config works with ``toolrollout tools list`` and ``tools call``.

The real CLI runs on each file of ``tool_configs/``: the command opens the tools' services
itself (the MCP sessions, the local sandbox, the local retriever), so a call reaches the
real backend and its answer is checked. Configs that name a fixed local port run from a
copy on a free port (the rest of the file unchanged), so a busy port cannot make them
talk to some other server. The configs whose servers start per command (stdio MCP
servers, the sandbox, the retriever) are ``slow``: each start imports toolrollout anew.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests._processes import stop
from typer.testing import CliRunner, Result

from toolrollout.apps.cli import app

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "tool_configs"
CALCULATION = json.dumps({"expression": "3 * (4 + 5)"})


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def on_free_port(tmp_path: Path, names: list[str], old: int) -> tuple[Path, int]:
    """Copy shipped files into ``tmp_path`` with ``127.0.0.1:<old>`` moved to a free port."""
    port = free_port()
    for name in names:
        text = (CONFIGS / name).read_text(encoding="utf-8")
        assert f"127.0.0.1:{old}" in text or name.endswith(".yaml"), name
        (tmp_path / name).write_text(
            text.replace(f"127.0.0.1:{old}", f"127.0.0.1:{port}"), encoding="utf-8"
        )
    return tmp_path / names[0], port


def tools(*args: str) -> Result:
    return CliRunner(env={"COLUMNS": "120"}).invoke(app, ["tools", *args])


def listed(config: Path) -> list[str]:
    result = tools("list", "--json", "--tool-config", str(config))
    assert result.exit_code == 0, result.output
    return [schema["function"]["name"] for schema in json.loads(result.stdout)]


def called(config: Path, name: str, arguments: dict[str, object] | str) -> Result:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    result = tools("call", name, "--args", args, "--tool-config", str(config))
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert "status: ok" in result.stderr, result.stderr
    return result


def test_every_shipped_tool_config_has_a_test_here() -> None:
    tested = {"calculator", "mcp_stdio", "mcp_http", "sandbox", "search", "video", "video_demo"}
    shipped = {p.stem for p in CONFIGS.glob("*.yaml") if p.stem != "interactions"}
    assert shipped == tested


def test_calculator_yaml() -> None:
    config = CONFIGS / "calculator.yaml"
    assert listed(config) == ["calculator"]
    assert called(config, "calculator", CALCULATION).stdout == "27\n"


@pytest.mark.slow
def test_mcp_stdio_yaml() -> None:
    config = CONFIGS / "mcp_stdio.yaml"
    assert listed(config) == ["calculator"]
    assert called(config, "calculator", CALCULATION).stdout == "27\n"


@pytest.fixture
def mcp_http_server(tmp_path: Path) -> Iterator[Path]:
    """The demo calculator MCP server over streamable HTTP, as mcp_http.yaml's comment says."""
    config, port = on_free_port(tmp_path, ["mcp_http.yaml", "mcp_servers_http.json"], 8765)
    argv = [sys.executable, "-m", "toolrollout.apps.mcp_servers.calculator"]
    argv += ["--transport", "streamable-http", "--port", str(port)]
    process = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if process.poll() is not None:
                    assert process.stderr is not None
                    pytest.fail(f"the MCP server exited: {process.stderr.read().decode()}")
                if time.monotonic() > deadline:
                    pytest.fail("the MCP server did not listen within 60 s")
                time.sleep(0.1)
        yield config
    finally:
        stop(process)


def test_mcp_http_yaml(mcp_http_server: Path) -> None:
    assert listed(mcp_http_server) == ["calculator"]
    assert called(mcp_http_server, "calculator", CALCULATION).stdout == "27\n"


def require_bwrap() -> None:
    """Skip without bubblewrap, as the sandbox tests do (a failure on CI: .ci/run installs it)."""
    if shutil.which("bwrap") is None:
        message = "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"
        if os.environ.get("CI"):
            pytest.fail(f"{message} (CI is set, so this is an error, not a skip)")
        pytest.skip(message)


@pytest.mark.slow
def test_sandbox_yaml(tmp_path: Path) -> None:
    require_bwrap()
    config, port = on_free_port(tmp_path, ["sandbox.yaml"], 8080)
    assert listed(config) == ["python"]
    code = "import sys\nprint(6 * 7)\nprint(sys.version_info[0])"
    result = called(config, "python", {"code": code})
    assert result.stdout == "42\n3\n"
    with socket.socket() as sock:  # the sandbox the command started is gone again
        assert sock.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.slow
def test_search_yaml(tmp_path: Path) -> None:
    config, port = on_free_port(tmp_path, ["search.yaml"], 8000)
    assert listed(config) == ["search"]
    result = called(config, "search", {"query_list": ["What is the capital of Ostonia?"]})
    assert result.stdout.startswith('Doc 1 (Title: "Ostonia")\n'), result.stdout
    assert "Its capital and largest city is Silverford." in result.stdout
    with socket.socket() as sock:  # the retriever the command started is gone again
        assert sock.connect_ex(("127.0.0.1", port)) != 0


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("av")
    from toolrollout.apps.demo_vl.video import Segment, make_video

    segments = [Segment(0.0, 2.0, "red", 1), Segment(2.0, 4.0, "blue", 2)]
    return make_video(tmp_path_factory.mktemp("video") / "clip.mp4", segments, fps=4)


def images_of(result: Result) -> int:
    match = re.search(r"images: (\d+)", result.stderr)
    assert match is not None, result.stderr
    return int(match.group(1))


@pytest.mark.slow
def test_video_yaml(clip: Path) -> None:
    config = CONFIGS / "video.yaml"
    assert listed(config) == ["crop_video", "crop_image"]
    frames = called(config, "crop_video", {"video_path": str(clip), "start_time": 0, "end_time": 3})
    assert images_of(frames) == 4  # the shipped server is capped at 4 frames per call
    crop = {"path": str(clip), "left": 0, "top": 0, "right": 0.5, "bottom": 0.5, "time": 2.5}
    assert images_of(called(config, "crop_image", crop)) == 1


@pytest.mark.slow
def test_video_demo_yaml(clip: Path) -> None:
    config = CONFIGS / "video_demo.yaml"
    assert listed(config) == ["crop_video"]
    frames = called(config, "crop_video", {"video_path": str(clip), "start_time": 1, "end_time": 2})
    assert images_of(frames) >= 1


@pytest.mark.slow
def test_tools_call_from_the_installed_command_opens_the_services(tmp_path: Path) -> None:
    """The same through ``python -m toolrollout``, in a process of its own (stdio MCP)."""
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "toolrollout", "tools", "call", "calculator"),
            *("--args", CALCULATION, "--tool-config", str(CONFIGS / "mcp_stdio.yaml")),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "27\n"
