"""The MCP calculator shows the model the same tool as the native calculator.

The demo model was trained on the native tool's schema; a server that reports another one
(the SDK's derived schema adds ``title`` keys and reorders keys) renders another prompt,
and the model's reward halves. Compared through the real MCP client and server (stdio),
as the model sees it: the schema JSON with its key order, and the rendered prompt.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

import toolrollout
from toolrollout.apps.demo import DEMO_MODEL_PATH
from toolrollout.tools import load_tool_config, open_tools

CONFIGS = Path(__file__).resolve().parents[2] / "tool_configs"


def _mcp_config(tmp_path: Path) -> Path:
    """tool_configs/mcp_stdio.yaml with its server started from this checkout's source.

    The stdio child gets only the SDK's safe environment, so ``PYTHONPATH`` is passed
    explicitly: the server that runs is the one under test, not an installed copy.
    """
    servers = json.loads((CONFIGS / "mcp_servers.json").read_text())
    source = str(Path(toolrollout.__file__).resolve().parents[1])
    servers["mcpServers"]["calculator"]["env"] = {"PYTHONPATH": source}
    (tmp_path / "mcp_servers.json").write_text(json.dumps(servers))
    config = yaml.safe_load((CONFIGS / "mcp_stdio.yaml").read_text())
    path = tmp_path / "mcp_stdio.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _mcp_schema(config: Path) -> dict[str, Any]:
    async def listed() -> dict[str, Any]:
        async with open_tools(load_tool_config(config)) as tools:
            (tool,) = tools
            return tool.schema()

    return anyio.run(listed)


@pytest.mark.slow
def test_mcp_calculator_reports_the_native_schema_content(tmp_path: Path) -> None:
    """Same keys and values as the native tool: no ``title`` keys, same descriptions."""
    (native,) = load_tool_config(CONFIGS / "calculator.yaml")
    mcp = _mcp_schema(_mcp_config(tmp_path))
    assert mcp == native.schema()
    assert "title" not in json.dumps(mcp)


@pytest.mark.slow
def test_mcp_calculator_renders_the_native_prompt(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    (native,) = load_tool_config(CONFIGS / "calculator.yaml")
    mcp = _mcp_schema(_mcp_config(tmp_path))
    # json.dumps keeps key order, which the chat template renders as it comes.
    assert json.dumps(mcp) == json.dumps(native.schema())
    tokenizer = AutoTokenizer.from_pretrained(str(DEMO_MODEL_PATH))
    messages = [{"role": "user", "content": "What is 37 * 12?"}]
    rendered = [
        tokenizer.apply_chat_template(messages, tools=[schema], tokenize=False)
        for schema in (mcp, native.schema())
    ]
    assert rendered[0] == rendered[1]
    assert '"title"' not in rendered[0]
