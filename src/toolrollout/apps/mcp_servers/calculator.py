"""The demo task's calculator as an MCP server (one tool, ``calculator``).

Run it with ``python -m toolrollout.apps.mcp_servers.calculator [--transport ...] [--port ...]``.
The arithmetic is :func:`toolrollout.tools.calculator.calculator`: parsed with :mod:`ast`,
never ``eval``; bad input comes back as an ``"Error: ..."`` text, like the native tool.

The server reports the native tool's schema (:data:`~toolrollout.tools.calculator.CALCULATOR_TOOL`)
as its ``inputSchema``, byte for byte, rather than the one the SDK derives: the demo model
was trained on the native one and scores far less with the derived one (docs/mcp.md).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool

from toolrollout.tools.calculator import CALCULATOR_TOOL
from toolrollout.tools.calculator import calculator as _calculate

from ._cli import serve

__all__ = ["build_server", "main"]


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return the result."""
    result = _calculate(expression)
    if result.startswith("Error:"):
        # An ``isError`` result (as the native CalculatorTool marks it); the SDK words
        # the text as "Error executing tool calculator: <reason>".
        raise ToolError(result.removeprefix("Error:").strip())
    return result


def build_server() -> MCPServer[object]:
    """A fresh server exposing the ``calculator`` tool with the native tool's schema."""
    function = CALCULATOR_TOOL["function"]
    tool = Tool.from_function(
        calculator,
        name=function["name"],
        description=function["description"],
        structured_output=False,
    )
    # The SDK still validates calls against the signature's pydantic model; only the
    # schema the server reports (and checks arguments against first) is replaced.
    tool = tool.model_copy(update={"parameters": copy.deepcopy(function["parameters"])})
    return MCPServer(
        "calculator",
        instructions="Evaluates arithmetic expressions safely (no eval).",
        log_level="WARNING",
        tools=[tool],
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``python -m toolrollout.apps.mcp_servers.calculator``."""
    serve(build_server(), argv)


if __name__ == "__main__":
    main()
