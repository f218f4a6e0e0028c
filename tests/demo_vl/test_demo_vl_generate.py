"""`toolrollout generate` with the VL demo and the real video MCP server, end to end.

The trained demo reads the question, calls ``crop_video`` on the clip (a stdio MCP server
started from ``tool_configs/video_demo.yaml``), gets frames back as images in its next turn
and names the colour. The clip sits in the run's working folder, which the server inherits,
so the relative name in the question is the path the tool opens.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from toolrollout.apps.demo_vl import DEMO_VL_MODEL_PATH
from toolrollout.apps.demo_vl.dialogs import HELDOUT_SEED_BASE, windows
from toolrollout.apps.demo_vl.video import make_video, plan_segments

pytest.importorskip("av")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]


def test_generate_calls_crop_video_and_answers_from_the_frames(tmp_path: Path) -> None:
    segments = plan_segments(HELDOUT_SEED_BASE + 777)
    make_video(tmp_path / "clip4.mp4", segments)
    a, b, colour = windows(segments)[4]  # a window of the third second-pair
    question = f"What colour is shown from second {a} to second {b} of clip4.mp4?"
    row = {"messages": [{"role": "user", "content": question}], "answer": colour}
    (tmp_path / "q.jsonl").write_text(json.dumps(row) + "\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "toolrollout",
            "generate",
            "--model",
            str(DEMO_VL_MODEL_PATH),
            "--tool-config",
            str(REPO / "tool_configs" / "video_demo.yaml"),
            "--dataset",
            "q.jsonl",
            "--n",
            "8",
            "--seed",
            "5",
            "--out",
            "out.jsonl",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=500,
    )
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert len(rows) == 8
    called = 0
    answered = 0
    for r in rows:
        messages = r["messages"] if isinstance(r["messages"], list) else json.loads(r["messages"])
        calls = [
            c["function"]
            for m in messages
            if m["role"] == "assistant"
            for c in m.get("tool_calls") or []
        ]
        arguments = [
            json.loads(c["arguments"]) if isinstance(c["arguments"], str) else c["arguments"]
            for c in calls
            if c["name"] == "crop_video"
        ]
        if {"video_path": "clip4.mp4", "start_time": a, "end_time": b} in arguments:
            called += 1
            assert r["images"], "a successful crop_video call must put frames in the context"
            assert len(r["image_spans"]) == len(r["images"])
        final = messages[-1]
        if final["role"] == "assistant" and colour in str(final["content"]):
            answered += 1
    # The pipeline is what this test is about (the quality bar is test_demo_vl_train's): the
    # model's own call reached the real MCP server and its frames came back into the context.
    assert called >= 1, rows
    assert answered >= 1, [r["messages"] for r in rows]
