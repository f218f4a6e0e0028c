"""``config.type: mcp`` tool configs and ``mcpServers`` files: the shipped stdio config, a
third-party server from PyPI loaded from config files alone, and errors that name the file
and the key."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from mcp.types import Tool as McpToolInfo
from mcp_helpers import REPO, child_pids

from toolrollout.exceptions import ConfigError
from toolrollout.tools import ToolCallRequest, ToolExecutor, load_tool_config
from toolrollout.tools.mcp import McpTool, mcp_sessions
from toolrollout.tools.mcp import _config as mcp_config
from toolrollout.tools.mcp._servers import HttpServer, StdioServer, parse_mcp_servers

pytestmark = pytest.mark.usefixtures("no_orphans")


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


async def test_shipped_stdio_config_runs_the_calculator() -> None:
    children = child_pids()
    tools = load_tool_config(REPO / "tool_configs" / "mcp_stdio.yaml")
    # Loading listed the tools over a short-lived session: nothing is left running.
    assert child_pids() == children
    assert [t.name for t in tools] == ["calculator"]
    (tool,) = tools
    assert isinstance(tool, McpTool) and tool.server == "calculator"
    assert (tool.limits.timeout, tool.limits.max_concurrency, tool.limits.retry.retries) == (
        10,
        64,
        2,
    )
    assert tool.schema()["function"]["parameters"]["required"] == ["expression"]
    assert not tool.manager.is_open

    async with mcp_sessions(tools) as managers:
        assert managers == [tool.manager] and tool.manager.is_open
        executor = ToolExecutor(tools)
        results = await executor.run_calls(
            [ToolCallRequest("calculator", {"expression": f"{i} * 7"}) for i in range(8)]
            + [ToolCallRequest("calculator", '{"expression": "1 / 0"}')]
        )
        assert [r.text for r in results[:8]] == [str(i * 7) for i in range(8)]
        assert results[8].is_error and results[8].error_kind == "ToolExecutionError"
        assert "division by zero" in results[8].text
        assert tool.manager.statistics()["calculator"].sessions_opened == 1
    assert not tool.manager.is_open
    assert child_pids() == children


# verl's (<= 0.7.1) MCP tool entry, with our servers file.
VERL_MCP_ENTRY = """\
tools:
  - class_name: verl.tools.mcp_base_tool.MCPBaseTool
    config:
      rate_limit: 120
      timeout: 30
      type: mcp
    mcp:
      mcp_servers_config_path: ./servers.json
      tool_selected_list:
        - {selected}
"""


async def test_third_party_server_from_pypi_loads_from_config_files(tmp_path: Path) -> None:
    """``mcp-server-time`` (the MCP project's reference server), nothing but config files."""
    servers = {
        "mcpServers": {
            "time": {
                "command": "${PYTHON}",
                "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"],
            }
        }
    }
    write(tmp_path, "servers.json", json.dumps(servers))
    config = write(tmp_path, "tools.yaml", VERL_MCP_ENTRY.format(selected="get_current_time"))
    tools = load_tool_config(config)
    # The allow-list keeps get_current_time and drops the server's convert_time.
    assert [t.name for t in tools] == ["get_current_time"]
    assert tools[0].limits.rate_limit == 120

    async with mcp_sessions(tools):
        executor = ToolExecutor(tools)
        paris, bogus = await executor.run_calls(
            [
                ToolCallRequest("get_current_time", {"timezone": "Europe/Paris"}),
                ToolCallRequest("get_current_time", {"timezone": "Nowhere/Atlantis"}),
            ]
        )
    assert not paris.is_error, paris.text
    assert paris.structured is not None and paris.structured["timezone"] == "Europe/Paris"
    assert "Europe/Paris" in paris.text
    assert bogus.is_error and "Nowhere/Atlantis" in bogus.text


GOOD_SERVERS = json.dumps(
    {"mcpServers": {"calc": {"command": "${PYTHON}", "args": ["-m", "nothing"]}}}
)


def entry(mcp: str = "{mcp_servers_config_path: servers.json}", extra: str = "") -> str:
    return (
        "tools:\n  - class_name: toolrollout.tools.mcp.McpTool\n"
        f"    config: {{type: mcp{extra}}}\n    mcp: {mcp}\n"
    )


@pytest.mark.parametrize(
    ("yaml_text", "servers_text", "expected"),
    [
        (
            "tools:\n  - class_name: toolrollout.tools.mcp.McpTool\n    config: {type: mcp}\n",
            GOOD_SERVERS,
            "tools[0].mcp: is required for config.type 'mcp'",
        ),
        (
            entry("{mcp_servers_config_path: servers.json, tool_list: [a]}"),
            GOOD_SERVERS,
            "tools[0].mcp.tool_list: unknown key",
        ),
        (entry("{}"), GOOD_SERVERS, "tools[0].mcp.mcp_servers_config_path: is required"),
        (
            entry("{mcp_servers_config_path: servers.json, connect_timeout: -1}"),
            GOOD_SERVERS,
            "tools[0].mcp.connect_timeout: must be a positive number (got -1)",
        ),
        (
            entry("{mcp_servers_config_path: servers.json, progress_idle_timeout: 0}"),
            GOOD_SERVERS,
            "tools[0].mcp.progress_idle_timeout: must be a positive number (got 0)",
        ),
        (
            entry("{mcp_servers_config_path: servers.json, heartbeat_interval: fast}"),
            GOOD_SERVERS,
            "tools[0].mcp.heartbeat_interval: ",
        ),
        (
            entry("{mcp_servers_config_path: servers.json, roots: [{name: x}]}"),
            GOOD_SERVERS,
            "tools[0].mcp.roots[0]: Value error, give either 'path' or 'uri'",
        ),
        (
            entry("{mcp_servers_config_path: servers.json, sampling_callback: 'no_such_mod:f'}"),
            GOOD_SERVERS,
            "tools[0].mcp.sampling_callback: cannot import 'no_such_mod:f'",
        ),
        (
            entry("{mcp_servers_config_path: servers.json, elicitation_callback: 'json:__doc__'}"),
            GOOD_SERVERS,
            "tools[0].mcp.elicitation_callback: 'json:__doc__' is not callable",
        ),
        (entry(extra=", url: x"), GOOD_SERVERS, "tools[0].config.url: unknown key"),
        (
            entry().replace("toolrollout.tools.mcp.McpTool", "toolrollout.tools.CalculatorTool"),
            GOOD_SERVERS,
            "tools[0].class_name: 'toolrollout.tools.CalculatorTool' is not an McpTool subclass",
        ),
        (
            entry().replace("McpTool", "NoSuchTool"),
            GOOD_SERVERS,
            "tools[0].class_name: cannot import 'toolrollout.tools.mcp.NoSuchTool'",
        ),
        (
            entry() + "    tool_schema: {type: function, function: {name: x}}\n",
            GOOD_SERVERS,
            "tools[0].tool_schema: not supported for config.type 'mcp'",
        ),
        (
            entry("{mcp_servers_config_path: missing.json}"),
            GOOD_SERVERS,
            "tools[0].mcp.mcp_servers_config_path: DIR/missing.json: cannot read the file",
        ),
        (
            entry(),
            '{"mcpServers": {"calc": {"command": "x",}}}',
            "servers.json: invalid JSON at line 1, column ",
        ),
        (
            entry(),
            '{"mcpServers": {"calc": {"command": 3}}}',
            "servers.json: mcpServers.calc.command: must be a string (got 3)",
        ),
        (
            entry(),
            '{"mcpServers": {"calc": {"args": ["a"]}}}',
            "servers.json: mcpServers.calc: needs either 'command' (stdio) or 'url' (HTTP)",
        ),
        (
            entry(),
            '{"mcpServers": {"calc": {"command": "x", "url": "http://h/mcp"}}}',
            "servers.json: mcpServers.calc.url: a server with a 'command' is started on this "
            "machine, so its url must be local (127.0.0.1 or localhost), got 'http://h/mcp'",
        ),
        (
            entry(),
            '{"mcpServers": {"calc": {"command": "x", "url": "http://127.0.0.1/mcp"}}}',
            "servers.json: mcpServers.calc.url: a started server needs a port: "
            "'http://127.0.0.1/mcp'",
        ),
        (
            entry(),
            '{"mcpServers": {"calc": {"command": "x", "args": ["-m", "${NOPE}"]}}}',
            "servers.json: mcpServers.calc.args[1]: unknown placeholder '${NOPE}'",
        ),
        (
            entry(),
            '{"mcpServers": {"web": {"url": "ftp://host/mcp"}}}',
            "servers.json: mcpServers.web.url: must be an http(s) URL",
        ),
        (
            entry(),
            '{"mcpServers": {"web": {"url": "http://h/mcp", "transport": "carrier-pigeon"}}}',
            "servers.json: mcpServers.web.transport: must be one of",
        ),
        (entry(), '{"mcpServers": {}}', "servers.json: mcpServers: no (enabled) servers"),
        (
            entry(),
            '{"mcpServers": {"calc": {"command": "/nonexistent/mcp-server"}}}',
            "tools[0].mcp: cannot list the tools of the servers in",
        ),
    ],
)
def test_config_errors_name_the_file_and_the_key(
    tmp_path: Path, yaml_text: str, servers_text: str, expected: str
) -> None:
    write(tmp_path, "servers.json", servers_text)
    config = write(tmp_path, "tools.yaml", yaml_text)
    with pytest.raises(ConfigError) as info:
        load_tool_config(config)
    message = str(info.value)
    assert message.startswith(f"{config}: "), message
    assert expected.replace("DIR", str(tmp_path.resolve())) in message, message
    if "servers.json:" in expected:  # errors inside the JSON file name it too
        assert f"{tmp_path.resolve() / 'servers.json'}: " in message


def test_verl_mcp_class_under_type_native_points_to_type_mcp(tmp_path: Path) -> None:
    text = "tools:\n  - class_name: verl.tools.mcp_search_tool.MCPSearchTool\n"
    config = write(tmp_path, "tools.yaml", text)
    with pytest.raises(ConfigError, match=r"tools\[0\]\.class_name: .*set config\.type: mcp"):
        load_tool_config(config)


def test_servers_file_conventions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCP_TEST_TOKEN", "s3cret")
    servers = parse_mcp_servers(
        {
            "mcpServers": {
                "local": {
                    "command": "${PYTHON}",
                    "args": ["${CONFIG_DIR}/server.py"],
                    "env": {"TOKEN": "${env:MCP_TEST_TOKEN}"},
                    "cwd": "work",
                    "description": "keys of other hosts are ignored",
                },
                "http": {"url": "http://127.0.0.1:1/mcp"},
                "sse": {"url": "http://127.0.0.1:1/sse"},
                "sse_query": {"url": "http://127.0.0.1:1/sse?key=1"},
                "not_sse": {"url": "http://127.0.0.1:1/ssez/mcp"},
                "explicit": {"url": "http://127.0.0.1:1/sse", "transport": "http"},
                "vscode": {"url": "http://127.0.0.1:1/events", "type": "sse"},
                "verl": {"url": "https://host/mcp", "auth_token": "t0ken", "timeout": 5},
                "off": {"command": "nothing", "disabled": True},
            }
        },
        source="servers.json",
        config_dir=tmp_path,
    )
    local = servers["local"]
    assert isinstance(local, StdioServer)
    assert local.command == sys.executable
    assert local.args == (f"{tmp_path}/server.py",)
    assert local.env == {"TOKEN": "s3cret"}
    assert local.cwd == str(tmp_path / "work")
    transports = {
        name: spec.transport for name, spec in servers.items() if isinstance(spec, HttpServer)
    }
    assert transports == {
        "http": "streamable-http",
        "sse": "sse",
        "sse_query": "sse",
        "not_sse": "streamable-http",
        "explicit": "streamable-http",
        "vscode": "sse",
        "verl": "streamable-http",
    }
    verl = servers["verl"]
    assert isinstance(verl, HttpServer)
    assert verl.headers == {"Authorization": "Bearer t0ken"} and verl.timeout == 5
    assert "off" not in servers
    # Secrets stay out of reprs and descriptions.
    assert "t0ken" not in repr(verl) + verl.describe()
    assert "s3cret" not in repr(local) + local.describe()

    # VS Code's root key and a bare mapping of servers are accepted too.
    for data in ({"servers": {"a": {"command": "x"}}}, {"a": {"command": "x"}}):
        assert list(parse_mcp_servers(data)) == ["a"]
    with pytest.raises(ConfigError, match=r"servers\.json: mcpServers\.a\.env\.K: .*'UNSET_VAR"):
        parse_mcp_servers(
            {"mcpServers": {"a": {"command": "x", "env": {"K": "${env:UNSET_VAR_XYZ}"}}}},
            source="servers.json",
        )


def test_allow_list_names_unknown_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    listings = {"calc": [McpToolInfo(name="add", input_schema={"type": "object"})]}
    monkeypatch.setattr(mcp_config, "discover_tools", lambda servers, **_: listings)
    write(tmp_path, "servers.json", GOOD_SERVERS)
    selected = "{mcp_servers_config_path: servers.json, tool_selected_list: [add, sub, mul]}"
    config = write(tmp_path, "tools.yaml", entry(selected))
    with pytest.raises(ConfigError) as info:
        load_tool_config(config)
    assert str(info.value) == (
        f"{config}: tools[0].mcp.tool_selected_list: no server in "
        f"{tmp_path.resolve() / 'servers.json'} lists the tool(s) 'sub', 'mul'; available: add"
    )
    config = write(tmp_path, "tools.yaml", entry(selected.replace(", sub, mul", "")))
    assert [t.name for t in load_tool_config(config)] == ["add"]
