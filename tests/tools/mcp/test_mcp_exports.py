"""The MCP SDK stays optional at import time (the export contract is in tests/test_exports.py)."""

from __future__ import annotations


def test_importing_toolrollout_tools_does_not_import_the_mcp_sdk() -> None:
    import subprocess
    import sys

    code = "import sys, toolrollout.tools; print('mcp' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
