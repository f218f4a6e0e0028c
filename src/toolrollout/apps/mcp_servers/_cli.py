"""The command line shared by the example servers: pick a transport, serve, exit."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any, NoReturn

from mcp.server.mcpserver import MCPServer

__all__ = ["TRANSPORTS", "serve"]

TRANSPORTS = ("stdio", "streamable-http", "sse")
"""Transports every example server speaks."""


def serve(server: MCPServer[Any], argv: Sequence[str] | None = None) -> NoReturn:
    """Parse ``--transport/--host/--port`` from ``argv`` (default: ``sys.argv``), serve
    until the transport ends, then exit the process."""
    parser = argparse.ArgumentParser(
        prog=f"python -m toolrollout.apps.mcp_servers.{server.name}",
        description=server.instructions,
    )
    parser.add_argument("--transport", choices=TRANSPORTS, default="stdio")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (HTTP transports)")
    parser.add_argument("--port", type=int, default=8000, help="port to bind (HTTP transports)")
    args = parser.parse_args(argv)
    code = 0
    try:
        if args.transport == "stdio":
            server.run("stdio")
        else:  # at http://HOST:PORT/mcp, or /sse (with messages POSTed to /messages/)
            server.run(args.transport, host=args.host, port=args.port)
    except KeyboardInterrupt:
        code = 130
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    # The server has finished (stdin closed, or stopped). Skipping the interpreter's teardown
    # of the SDK's modules (most of a second) lets a client that closes the session reap
    # this process at once; the standard streams are all there is left to flush.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
