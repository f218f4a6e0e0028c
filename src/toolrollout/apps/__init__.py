"""The applications built on the library, each behind an extra.

Everything under ``toolrollout.apps`` is a program rather than something a trainer imports:
the embedded engine's server (``server``), the OpenAI/Anthropic-compatible recording proxy
(``gateway``), the command line (``cli``), evaluation (``eval``), the throughput benchmark
(``bench``), the Ray driver (``distributed``), the demo models and their training scripts
(``demo``, ``demo_vl``) and the MCP servers toolrollout ships (``mcp_servers``). They import
the library; the library never imports them (``tests/test_import_graph.py``).
"""

from __future__ import annotations

__all__ = ["main"]


def main() -> None:
    """The ``toolrollout`` console script: one line naming the extra when the command's own
    dependencies (typer, rich) are not installed, else the command line."""
    import sys

    from toolrollout._exceptions import MissingExtraError
    from toolrollout._extras import require_extra

    try:
        require_extra("cli", "the toolrollout command", "typer", "rich")
    except MissingExtraError as exc:
        sys.exit(f"error: {exc}")
    from toolrollout.apps.cli import main as command_line

    command_line()
