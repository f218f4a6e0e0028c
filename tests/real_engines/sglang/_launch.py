"""Start and stop real SGLang servers (PyPI's ``sglang``, in ``.engines/sglang``) on loopback.

The CPU recipe (docs/engines.md, "Real SGLang on a CPU"): ``SGLANG_USE_CPU_ENGINE=1``,
``--device cpu``, ``--attention-backend torch_native`` (the x86 default needs AMX), a small
context and KV pool, and ``--dtype float32`` so that the served logprobs are the float32
checkpoint's. ``.ci/sglang.sh`` builds the virtualenv; without it a test skips, or fails
when ``CI`` is set.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests._processes import free_port

REPO = Path(__file__).resolve().parents[3]
VENV = REPO / ".engines" / "sglang"
SGLANG = VENV / "bin" / "sglang"
DEMO_MODEL = REPO / "src" / "toolrollout" / "apps" / "demo" / "model"
START_TIMEOUT = 480.0
"""Seconds to healthy: 45 s on a quiet two-core machine (30 of them imports), 190 s on a
busy one. Tests here take `pytest.mark.timeout(LIMIT)`: pytest-timeout counts the setup."""
LIMIT = 900

CPU_ARGS = (
    "--device", "cpu",
    "--attention-backend", "torch_native",
    "--context-length", "1024",
    "--max-total-tokens", "8192",
    "--mem-fraction-static", "0.05",
    "--random-seed", "0",
)  # fmt: skip
"""Flags every test server gets; ``--dtype`` and the rest come per server."""


@dataclass(frozen=True)
class SGLangServer:
    """A running real SGLang server."""

    url: str
    model_path: Path
    log: Path
    args: tuple[str, ...]

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def require_sglang() -> Path:
    """The ``sglang`` command of the engine venv; skip without it (fail when ``CI`` is set)."""
    if SGLANG.exists():
        return SGLANG
    message = f"real SGLang is not installed ({VENV} missing): run bash .ci/sglang.sh"
    if os.environ.get("CI"):
        pytest.fail(f"{message} (CI is set, so this is an error, not a skip)", pytrace=False)
    pytest.skip(message)


def server_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        SGLANG_USE_CPU_ENGINE="1",  # without it SGLang's is_cpu() is false
        HF_HUB_OFFLINE="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        OMP_NUM_THREADS="1",  # a tiny model; the test process shares the cores
    )
    env.pop("PYTHONPATH", None)  # the engine venv's packages, not the project's
    return env


@contextmanager
def sglang_server(
    log_dir: Path,
    *,
    dtype: str = "float32",
    model_path: Path = DEMO_MODEL,
    extra_args: Sequence[str] = (),
    timeout: float = START_TIMEOUT,
) -> Iterator[SGLangServer]:
    """One ``sglang serve`` process on a free loopback port, healthy, killed on exit."""
    command = require_sglang()
    port = free_port()
    args = (
        "--model-path", str(model_path), "--host", "127.0.0.1", "--port", str(port),
        "--dtype", dtype, *CPU_ARGS, *extra_args,
    )  # fmt: skip
    log = log_dir / f"sglang-{port}.log"
    server = SGLangServer(f"http://127.0.0.1:{port}", model_path, log, args)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(command), "serve", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=server_env(),
            start_new_session=True,  # its scheduler and detokenizer processes share the group
        )
    try:
        _wait_healthy(server, proc, timeout)
        yield server
    finally:
        _stop_group(proc)


def _wait_healthy(server: SGLangServer, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sglang serve exited with {proc.returncode}:\n{server.log_tail()}")
        try:
            if httpx.get(server.url + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{server.url} not healthy after {timeout:g} s:\n{server.log_tail()}")


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's process group, SIGKILL to what is left after 20 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # children that outlived the parent
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)
