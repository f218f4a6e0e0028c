"""The local sandbox server, started once for the sandbox tests as a real subprocess.

Tests that need bubblewrap skip with a clear reason when ``bwrap`` is not installed, except
on CI (``CI`` set), where its absence is a failure: .ci/run installs it. The same holds for
the sandbox runtime (``.sandbox-runtime/``: the python packages' virtualenv and tsx) and the
toolchains of the languages beyond python and bash (:func:`require_language`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from toolrollout.sandbox import free_port

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
    health = httpx.get(f"{url}/health", timeout=10).json()
    if language not in health["languages"]:
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


@pytest.fixture(scope="session")
def sandbox_url() -> Iterator[str]:
    """Base URL of ``toolrollout sandbox serve`` running with bwrap (session-wide)."""
    require_bwrap()
    port = free_port()
    log = tempfile.TemporaryFile()
    argv = [sys.executable, "-m", "toolrollout", "sandbox", "serve", "--port", str(port)]
    argv += ["--max-concurrency", "2", "--memory-limit-mb", str(SERVER_MEMORY_MB)]
    argv += ["--max-processes", str(SERVER_MAX_PROCESSES)]
    argv += ["--max-output-bytes", str(SERVER_MAX_OUTPUT), "--log-level", "warning"]
    if RUNTIME_PYTHON.exists():  # python code gets numpy, pandas, scipy, sympy
        argv += ["--python", str(RUNTIME_PYTHON)]
    if TSX.exists():
        argv += ["--program", f"tsx={TSX}"]
    process = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                log.seek(0)
                pytest.fail(f"sandbox server exited: {log.read().decode(errors='replace')}")
            try:
                if httpx.get(f"{url}/v1/ping", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("sandbox server did not start within 60 s")
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
