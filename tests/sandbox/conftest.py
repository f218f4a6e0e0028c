"""The local sandbox server, started once for the sandbox tests as a real subprocess.

Tests that need bubblewrap skip with a clear reason when ``bwrap`` is not installed, except
on CI (``CI`` set), where its absence is a failure: .ci/run installs it. The same holds for
the sandbox runtime (``.sandbox-runtime/``: the python packages' virtualenv and tsx) and the
toolchains of the languages beyond python and bash (:func:`require_language`).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import httpx
import pytest
from tests.sandbox._support import (
    RUNTIME_PYTHON,
    SERVER_MAX_OUTPUT,
    SERVER_MAX_PROCESSES,
    SERVER_MEMORY_MB,
    TSX,
    require_bwrap,
)

from toolrollout.sandbox._background import free_port


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
