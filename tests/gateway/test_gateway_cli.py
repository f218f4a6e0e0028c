"""``toolrollout gateway`` end to end: the demo model on the embedded engine (the default,
as ``generate`` uses it), an OpenAI SDK agent with a real calculator on the client side,
and the recorded file after a SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from toolrollout.apps.demo import load_demo_prompts
from toolrollout.chat import ChatFormat, check_drift
from toolrollout.rollout import TokenSpan, Trajectory, TrajectoryStatus, read_rows
from toolrollout.tools.calculator import CALCULATOR_TOOL, calculator

from .._processes import free_port, stop, wait_http
from .conftest import rebuilt

pytestmark = pytest.mark.slow

SRC = Path(__file__).parents[2] / "src"


def run_agent(client: Any, messages: list[Any], *, temperature: float | None = 0.0) -> list[Any]:
    """The demo's calculator agent over the SDK (``client``: ``openai.OpenAI``, typed Any as
    its overloads want TypedDict messages): up to four model calls, each tool call answered,
    until the model answers without one (``temperature`` None: the server's default)."""
    sampling = {} if temperature is None else {"temperature": temperature}
    for _ in range(4):
        reply = client.chat.completions.create(
            model="toolrollout", messages=messages, tools=[CALCULATOR_TOOL], max_tokens=64,
            **sampling,
        )  # fmt: skip
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return messages
        for call in message.tool_calls:
            result = calculator(json.loads(call.function.arguments)["expression"])
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return messages


def test_the_gateway_command_records_an_sdk_agent(tmp_path: Path, demo_tokenizer: Any) -> None:
    out = tmp_path / "sessions.parquet"
    port = free_port()
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolrollout", "gateway", "--port", str(port), "--out", str(out)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", 120, proc)
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1",
            api_key="harness-key",
            default_headers={"X-Toolrollout-Session": "episode-1"},
        )
        row = load_demo_prompts()[0]
        messages = run_agent(client, list(row["messages"]))
        assert any(m["role"] == "tool" for m in messages)
        closed = httpx.post(
            f"http://127.0.0.1:{port}/v1/sessions/episode-1/close", json={"reward": 1.0}
        ).json()
        assert [r["segment"] for r in closed["rows"]] == [0]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err.decode()
        assert b"1 rows ->" in err
    finally:
        stop(proc)
    (recorded,) = read_rows(out)
    assert recorded["group_id"] == "episode-1" and recorded["reward"] == 1.0
    assert recorded["num_turns"] == sum(1 for m in messages if m["role"] == "assistant")
    pairs = zip(recorded["rollout_logprobs"], recorded["loss_mask"], strict=True)
    assert all(lp < 0 for lp, masked in pairs if masked)
    # the row as spans again (runs of equal mask), then the family's rule on its messages
    spans, at = [], 0
    for masked, length in _runs(recorded["loss_mask"]):
        end = at + length
        ids = tuple(recorded["response_ids"][at:end])
        lps = tuple(recorded["rollout_logprobs"][at:end])
        spans.append(TokenSpan("model" if masked else "tool", ids, lps))
        at = end
    trajectory = Trajectory(
        uid="x",
        group_id="g",
        prompt_index=0,
        sample_index=0,
        prompt_ids=tuple(recorded["prompt_ids"]),
        spans=tuple(spans),
        messages=tuple(recorded["messages"]),
        status=TrajectoryStatus.COMPLETED,
        finish_reason="stop",
    )
    chat = ChatFormat(demo_tokenizer, tools=[CALCULATOR_TOOL])
    full_ids = [*recorded["prompt_ids"], *recorded["response_ids"]]
    assert full_ids == rebuilt(trajectory, chat)
    assert check_drift(full_ids, recorded["messages"], chat_format=chat).expected


def _runs(mask: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for m in mask:
        if runs and runs[-1][0] == m:
            runs[-1] = (m, runs[-1][1] + 1)
        else:
            runs.append((m, 1))
    return runs
