"""``toolrollout gateway`` in front of a real engine, driven by the OpenAI SDK as a harness
drives it: the one session both engines' gateway tests record and check."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import openai

from tests._processes import free_port, stop, wait_http
from tests.gateway.test_gateway_cli import run_agent
from toolrollout.apps.demo import DEMO_MODEL_PATH, load_demo_prompts
from toolrollout.chat import ChatFormat, check_drift
from toolrollout.rollout import read_rows
from toolrollout.tools.calculator import CALCULATOR_TOOL

SESSION = "episode-1"


class AnsweredWithoutTool(AssertionError):
    """The agent's session ended without a tool call (a sampled session can, rarely)."""


def record_sdk_session(
    engine_url: str, out: Path, *, temperature: float | None
) -> tuple[list[Any], dict[str, Any]]:
    """One SDK session through ``toolrollout gateway --engine-url`` (the demo's first
    prompt), closed with a reward and the gateway stopped with SIGTERM: the agent's
    messages and the one row the gateway wrote to ``out``.

    Checked here for both engines: the agent called its tool, the session closed into one
    segment, the gateway exited cleanly, the row counts the agent's model turns, every
    model token has a logprob, and a fresh render of the row's messages gives its ids.
    """
    src = str(Path(__file__).resolve().parents[2] / "src")
    path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "160", "PYTHONPATH": path}
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolrollout", "gateway", "--engine-url", engine_url,
         "--port", str(port), "--out", str(out)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        wait_http(f"{base}/health", 120, proc)
        client = openai.OpenAI(
            base_url=f"{base}/v1",
            api_key="harness-key",
            default_headers={"X-Toolrollout-Session": SESSION},
        )
        messages = run_agent(
            client, list(load_demo_prompts()[0]["messages"]), temperature=temperature
        )
        if not any(m["role"] == "tool" for m in messages):
            raise AnsweredWithoutTool(f"the agent answered without its tool: {messages[-1]}")
        closed = httpx.post(f"{base}/v1/sessions/{SESSION}/close", json={"reward": 1.0}).json()
        assert [r["segment"] for r in closed["rows"]] == [0]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err.decode()
    finally:
        stop(proc)
    (row,) = read_rows(out)
    assert row["num_turns"] == sum(1 for m in messages if m["role"] == "assistant")
    model = [lp for lp, m in zip(row["rollout_logprobs"], row["loss_mask"], strict=True) if m]
    assert model and all(lp < 0.0 for lp in model)
    from transformers import AutoTokenizer

    chat = ChatFormat(AutoTokenizer.from_pretrained(str(DEMO_MODEL_PATH)), tools=[CALCULATOR_TOOL])
    full_ids = [*row["prompt_ids"], *row["response_ids"]]
    assert check_drift(full_ids, row["messages"], chat_format=chat).expected
    return messages, row
