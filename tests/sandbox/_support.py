"""Helpers shared by the sandbox tests and their conftest (imported as
``tests.sandbox._support``: a bare ``from conftest import`` picks whichever conftest was
imported first when several test folders run together)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import httpx
import pytest

SERVER_MEMORY_MB = 512
"""Enough for python with numpy, pandas, scipy and sympy imported (about 270 MB of address
space)."""
SERVER_MAX_PROCESSES = 32
SERVER_MAX_OUTPUT = 16 * 1024

REPO = Path(__file__).resolve().parents[2]
RUNTIME = Path(os.environ.get("TOOLROLLOUT_SANDBOX_RUNTIME", REPO / ".sandbox-runtime"))
"""What .ci/run builds: ``python/`` (requirements/sandbox-runtime.txt) and ``node/`` (tsx)."""
RUNTIME_PYTHON = RUNTIME / "python" / "bin" / "python"
TSX = RUNTIME / "node" / "node_modules" / ".bin" / "tsx"

SERVER_MEMORY_MB = 512
"""Enough for python with numpy, pandas, scipy and sympy imported (about 270 MB of address
space)."""
SERVER_MAX_PROCESSES = 32
SERVER_MAX_OUTPUT = 16 * 1024


def skip_or_fail(message: str) -> None:
    """Skip, or fail on CI (where .ci/run installs everything the sandbox tests need)."""
    if os.environ.get("CI"):
        pytest.fail(f"{message} (CI is set, so this is an error, not a skip)")
    pytest.skip(message)


def require_language(url: str, language: str) -> None:
    """Skip (fail on CI) when the server has no toolchain for ``language``."""
    info = httpx.get(f"{url}/server_info", timeout=10).json()
    if language not in info["languages"]:
        skip_or_fail(f"no {language} toolchain installed: see docs/sandbox.md, 'Languages'")


def require_runtime_python() -> None:
    if not RUNTIME_PYTHON.exists():
        skip_or_fail(
            f"no sandbox runtime at {RUNTIME_PYTHON}: python3 -m venv .sandbox-runtime/python "
            "&& .sandbox-runtime/python/bin/pip install -r requirements/sandbox-runtime.txt"
        )


def require_bwrap() -> str:
    """The bwrap path; skips the test without it (fails it on CI)."""
    path = shutil.which("bwrap")
    if path is None:
        message = "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"
        if os.environ.get("CI"):
            pytest.fail(f"{message} (CI is set, so this is an error, not a skip)")
        pytest.skip(message)
    return path
