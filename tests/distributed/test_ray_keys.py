"""The shared engine the Ray driver starts requires a key made for the run.

The whole path (driver -> server on every interface -> workers on two Ray nodes sending the
key) is ``test_ray_generate.py::test_two_worker_nodes_share_one_server``: with
``--ray-address`` the server binds 0.0.0.0, which it refuses without a key, and the run's
rows come back only if every worker sent it. Here the server itself is probed.
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from toolrollout.apps.distributed._engines import run_engines
from toolrollout.spec import RunSpec

GENERATE = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 1, "temperature": 0}}


@pytest.mark.slow
def test_the_shared_engine_needs_the_runs_own_key(monkeypatch: pytest.MonkeyPatch) -> None:
    # a key in the driver's environment is not the run's: the server gets a fresh one
    monkeypatch.setenv("TOOLROLLOUT_API_KEY", "from-the-users-shell")
    monkeypatch.setenv("TOOLROLLOUT_ADMIN_API_KEY", "admin-from-the-users-shell")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    spec = RunSpec(threads=1, health_timeout=120.0)
    keys = []
    for _ in range(2):
        with run_engines(None, spec, None) as engine:
            (url,) = engine.ready()
            key = engine.api_key
            assert key is not None and len(key) >= 32
            keys.append(key)
            assert httpx.get(f"{url}/health", timeout=10).status_code == 200
            for headers in ({}, {"Authorization": "Bearer from-the-users-shell"}):
                answer = httpx.post(f"{url}/generate", json=GENERATE, headers=headers, timeout=30)
                assert answer.status_code == 401
            mine = {"Authorization": f"Bearer {key}"}
            assert httpx.post(f"{url}/generate", json=GENERATE, headers=mine).status_code == 200
            # the workers abort with the same key: no admin key was carried over
            abort = httpx.post(f"{url}/abort_request", json={"rid": "x"}, headers=mine)
            assert abort.status_code == 200
            # never on the command line, where `ps` would show it
            served = engine._served  # the supervised server: its current process
            assert served is not None and served.service is not None
            pid = served.service.pid
            assert key not in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
            assert os.environ["TOOLROLLOUT_API_KEY"] == "from-the-users-shell"
    assert keys[0] != keys[1]
