"""The local sandbox server, started once for the sandbox tests as a real subprocess.

Tests that need bubblewrap skip with a clear reason when ``bwrap`` is not installed, except
on CI (``CI`` set), where its absence is a failure: .ci/run installs it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import httpx
import pytest

from toolrollout.sandbox import free_port

SERVER_MEMORY_MB = 256
SERVER_MAX_PROCESSES = 32
SERVER_MAX_OUTPUT = 16 * 1024


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
