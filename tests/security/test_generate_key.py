"""``toolrollout generate --engine-url`` against a server that requires a key: the key from
``TOOLROLLOUT_ENGINE_API_KEY`` (or ``--engine-api-key``) reaches it, and never the output."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests._serve_thread import serve_in_thread
from typer.testing import CliRunner

from toolrollout.apps.demo import DEMO_MODEL_PATH
from toolrollout.apps.server import default_security
from toolrollout.engines.embedded import EmbeddedEngine
from toolrollout.rollout import read_rows

KEY = "engine-key-for-generate-0123"


@pytest.fixture(scope="module")
def keyed_server() -> Iterator[str]:
    engine = EmbeddedEngine(DEMO_MODEL_PATH, max_batch_size=2, num_threads=1)
    asyncio.run(engine.start())
    try:
        with serve_in_thread(engine, security=default_security(api_key=KEY)) as url:
            yield url
    finally:
        asyncio.run(engine.aclose())


def _generate(url: str, out: Path, env: dict[str, str], *extra: str) -> tuple[int, str]:
    from toolrollout.apps.cli import app

    args = ["generate", "--engine-url", url, "--model", str(DEMO_MODEL_PATH), "--limit", "1"]
    args += ["--n", "1", "--max-turns", "1", "--max-new-tokens", "4", "--retries", "1"]
    result = CliRunner().invoke(app, [*args, "--out", str(out), *extra], env=env)
    return result.exit_code, result.output


def test_generate_sends_the_engine_key(keyed_server: str, tmp_path: Path) -> None:
    out = tmp_path / "ok.parquet"
    code, output = _generate(keyed_server, out, {"TOOLROLLOUT_ENGINE_API_KEY": KEY})
    assert code == 0, output
    rows = read_rows(out)
    assert rows and not any(r["failed"] for r in rows)
    assert KEY not in output and KEY.encode() not in out.read_bytes()
    flag = tmp_path / "flag.parquet"
    code, output = _generate(keyed_server, flag, {}, "--engine-api-key", KEY)
    assert code == 0, output
    assert not any(r["failed"] for r in read_rows(flag))


def test_generate_without_the_key_is_refused(keyed_server: str, tmp_path: Path) -> None:
    out = tmp_path / "no.parquet"
    code, output = _generate(keyed_server, out, {"TOOLROLLOUT_ENGINE_API_KEY": "wrong"})
    if code == 0:  # each sample's row says why it failed
        rows = read_rows(out)
        assert rows and all(r["failed"] for r in rows)
        assert all("401" in (r["error"] or "") for r in rows), rows
    else:
        assert "401" in output or "Unauthorized" in output, output
