"""Every documented command against a real vLLM server, as a user runs it (subprocesses).

``generate`` (with a tool config), ``eval``, ``gateway`` and ``bench --engine-url`` are
pointed at the shared vLLM server with nothing but its URL: the engine kind is found from
the server. What comes back is checked against implementations nobody here wrote: the
model tokens' logprobs against a float32 transformers recompute of the same ids at the
run's temperature (the sampling distribution's, within 1e-4), the rows against the chat
template's render, the eval figures against the rows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.real_engines._gateway import AnsweredWithoutTool, record_sdk_session
from toolrollout import UserError
from toolrollout.apps.demo import DEMO_MODEL_PATH, load_demo_prompts
from toolrollout.engines._factory import connect
from toolrollout.engines.vllm import VLLMClient
from toolrollout.rollout import read_rows

pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(900)]
"""A real server starts in 1-4 minutes on a loaded machine (setup counts toward the limit)."""

ROOT = Path(__file__).resolve().parents[3]
SRC = ROOT / "src"
ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "COLUMNS": "140",
    "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
}
PARITY = 1e-4
"""Engine logprob vs float32 teacher forcing of the same ids (measured: under 1e-5)."""


@pytest.fixture(scope="module")
def vllm_server(vllm_untied: Any) -> Any:
    """The session's server (the demo model, untied: the same logits); no module server."""
    return vllm_untied


def toolrollout(*args: str, cwd: Path, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toolrollout", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=ENV,
        timeout=timeout,
    )


def largest_logprob_gap(rows: list[dict[str, Any]], temperature: float) -> float:
    """Largest |row logprob - log_softmax(logits / T)| over the rows' model tokens."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(DEMO_MODEL_PATH), dtype=torch.float32)
    model.train(False)  # dropout off, as eval() (untyped) does
    worst = 0.0
    with torch.no_grad():
        for row in rows:
            prompt, ids = list(row["prompt_ids"]), list(row["response_ids"])
            logits = model(input_ids=torch.tensor([prompt + ids])).logits[0].float()
            scored = torch.log_softmax(logits[len(prompt) - 1 : -1] / temperature, dim=-1)
            policy = scored.gather(1, torch.tensor(ids)[:, None])[:, 0]
            engine = torch.tensor(row["rollout_logprobs"], dtype=torch.float32)
            trained = torch.tensor(row["loss_mask"], dtype=torch.bool)
            worst = max(worst, float((policy - engine)[trained].abs().max()))
    return worst


def test_generate_with_a_tool_config_writes_on_policy_rows(
    vllm_server: Any, tmp_path: Path
) -> None:
    proc = toolrollout(
        "generate",
        *("--engine-url", vllm_server.url),
        *("--tool-config", str(ROOT / "tool_configs" / "calculator.yaml")),
        *("--limit", "4", "--n", "2", "--max-turns", "3", "--max-new-tokens", "48"),
        *("--temperature", "0.7", "--seed", "0", "--out", "rows.parquet"),
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = read_rows(tmp_path / "rows.parquet")
    assert len(rows) == 8
    assert {r["status"] for r in rows} <= {"completed", "truncated"}, [r["error"] for r in rows]
    assert sum(r["num_tool_calls"] for r in rows) > 0 and not any(r["tool_errors"] for r in rows)
    assert all(r["weight_version"] for r in rows)  # vLLM's label, on every row
    assert all(r["metrics"].get("drift_mismatches", 0) == 0 for r in rows)
    # At T=0.7 vLLM's default logprobs (before temperature) are ~0.3 off: these must not be.
    assert largest_logprob_gap(rows, 0.7) < PARITY


def test_eval_figures_match_its_rows(vllm_server: Any, tmp_path: Path) -> None:
    data = tmp_path / "heldout.jsonl"
    with data.open("w") as fh:
        for row in load_demo_prompts()[:4]:
            fh.write(json.dumps(row) + "\n")
    proc = toolrollout(
        "eval",
        *("--engine-url", vllm_server.url, "--dataset", str(data), "--n", "2", "--sampled"),
        *("--seed", "5", "--max-new-tokens", "40", "--max-turns", "3"),
        *("--report-to", "none", "--out-dir", "out"),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    (rows_file,) = (tmp_path / "out").glob("*.parquet")
    rows = read_rows(rows_file)
    assert len(rows) == 8 and not any(r["failed"] for r in rows)
    correct = sum(1 for r in rows if r["reward"] is not None and r["reward"] >= 0.5)
    accuracy = next(v for k, v in _flat(metrics) if k.endswith("eval/accuracy"))
    assert accuracy == pytest.approx(correct / len(rows))
    assert largest_logprob_gap(rows, 1.0) < PARITY


def test_bench_compares_the_modes_on_the_server(vllm_server: Any, tmp_path: Path) -> None:
    proc = toolrollout(
        "bench",
        *("--engine-url", vllm_server.url, "--prompts", "3", "--n", "2", "--max-turns", "3"),
        *("--tokens-per-turn", "48", "--tool-median", "0.05", "--json", "bench.json"),
        *("--mode", "toolrollout", "--mode", "lockstep", "--mode", "bound"),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["engine"] == "vLLM" and report["server"]["vllm_version"]
    results = report["results"]
    ours, bound = results["toolrollout"], results["bound"]
    assert ours["trajectories"] == results["lockstep"]["trajectories"] == 6
    assert ours["completed"] == 6 and ours["errors"] == 0 and ours["tool_calls"] > 0
    # The bound replays toolrollout's own turns: the same turns, token for token as many.
    assert (bound["turns"], bound["generated_tokens"]) == (ours["turns"], ours["generated_tokens"])
    assert report["ratios"]["toolrollout_over_bound"] > 0
    assert not list(tmp_path.glob("*.turns.json"))  # the replay file is cleaned up


def _flat(data: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(data, dict):
        return [kv for k, v in data.items() for kv in _flat(v, f"{prefix}{k}/")]
    return [(prefix.rstrip("/"), data)]


def test_the_gateway_records_an_sdk_agent(vllm_server: Any, tmp_path: Path) -> None:
    """At the server's default temperature (1.0) the agent's first turn is sampled: it
    called its tool in 20 of 20 sessions here, and once in CI it did not, so a session
    without a tool call is repeated (up to three sessions, each its own gateway)."""
    for attempt in range(3):
        try:
            out = tmp_path / f"sessions-{attempt}.parquet"
            _, row = record_sdk_session(vllm_server.url, out, temperature=None)
            break
        except AnsweredWithoutTool:
            if attempt == 2:
                raise
    assert row["weight_version"]
    assert largest_logprob_gap([row], 1.0) < PARITY


def test_a_tied_models_reload_is_refused_on_a_cpu(vllm_server: Any) -> None:
    """vLLM's CPU reload would keep the demo model's tied output head on its old weights
    (test_trl_on_policy.py trains an untied copy instead). The session's server serves the
    untied copy, so the tied demo folder is named as the served one (``served_path``)."""

    async def reload() -> str | None:
        async with await connect([vllm_server.url]) as engine:
            assert isinstance(engine, VLLMClient)
            with pytest.raises(UserError, match="ties the output head"):
                await engine.update_weights_from_disk(
                    DEMO_MODEL_PATH, weight_version="x", served_path=DEMO_MODEL_PATH
                )
            return (await engine.info()).weight_version

    assert anyio.run(reload) != "x"  # nothing was sent
