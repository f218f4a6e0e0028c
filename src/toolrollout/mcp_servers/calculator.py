"""The demo task's calculator as an MCP server (one tool, ``calculator``).

Run it with ``python -m toolrollout.mcp_servers.calculator [--transport ...] [--port ...]``.
The arithmetic is :func:`toolrollout.tools.calculator.calculator`: parsed with :mod:`ast`,
never ``eval``; bad input comes back as an ``"Error: ..."`` text, like the native tool.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from toolrollout.tools.calculator import calculator as _calculate

from ._cli import serve

__all__ = ["build_server", "main"]


def build_server() -> MCPServer[object]:
    """A fresh server exposing the ``calculator`` tool."""
    server: MCPServer[object] = MCPServer(
        "calculator",
        instructions="Evaluates arithmetic expressions safely (no eval).",
        log_level="WARNING",
    )

    @server.tool(structured_output=False)
    def calculator(
        expression: Annotated[
            str,
            Field(description="Arithmetic with + - * / // % ** and parentheses, e.g. 3 * (4 + 5)"),
        ],
    ) -> str:
        """Evaluate an arithmetic expression and return the result."""
        result = _calculate(expression)
        if result.startswith("Error:"):
            # An ``isError`` result (as the native CalculatorTool marks it); the SDK words
            # the text as "Error executing tool calculator: <reason>".
            raise ToolError(result.removeprefix("Error:").strip())
        return result

    return server


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``python -m toolrollout.mcp_servers.calculator``."""
    serve(build_server(), argv)


if __name__ == "__main__":
    main()
