#!/usr/bin/env bash
# Third-party MCP servers the test suite runs (tests/tools/mcp/test_mcp_conformance.py):
# the MCP project's reference server (npm, pinned in .ci/node/package-lock.json) and two
# Python servers from PyPI, each in its own virtualenv so their dependencies (an older mcp
# SDK among them) never meet ours. Idempotent; .ci/run calls it, and so does the test
# fixture when something is missing.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}

if [ ! -f node/node_modules/@modelcontextprotocol/server-everything/package.json ]; then
    npm ci --prefix node --no-audit --no-fund --loglevel=error
fi

install_server() {  # <venv name> <console script> <requirement>
    if [ ! -x "venvs/$1/bin/$2" ]; then
        rm -rf "venvs/$1"
        "$PYTHON" -m venv "venvs/$1"
        "venvs/$1/bin/pip" install --quiet --disable-pip-version-check "$3"
    fi
}
install_server git mcp-server-git mcp-server-git==2026.10.19
install_server time mcp-server-time mcp-server-time==2026.10.19
