"""The command line shared by the example servers: pick a transport, then serve forever."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from mcp.server.mcpserver import MCPServer

__all__ = ["TRANSPORTS", "serve"]

TRANSPORTS = ("stdio", "streamable-http", "sse")
"""Transports every example server speaks."""


def serve(server: MCPServer[Any], argv: Sequence[str] | None = None) -> None:
    """Parse ``--transport/--host/--port`` from ``argv`` (default: ``sys.argv``) and run."""
    parser = argparse.ArgumentParser(
        prog=f"python -m toolrollout.mcp_servers.{server.name}",
        description=server.instructions,
    )
    parser.add_argument("--transport", choices=TRANSPORTS, default="stdio")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (HTTP transports)")
    parser.add_argument("--port", type=int, default=8000, help="port to bind (HTTP transports)")
    args = parser.parse_args(argv)
    if args.transport == "stdio":
        server.run("stdio")
    elif args.transport == "streamable-http":
        # The endpoint is http://HOST:PORT/mcp.
        server.run("streamable-http", host=args.host, port=args.port)
    else:
        # The event stream is http://HOST:PORT/sse (messages are POSTed to /messages/).
        server.run("sse", host=args.host, port=args.port)
