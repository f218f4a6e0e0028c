"""A verl-format multi-turn dataset, tool config and interaction config through
``toolrollout generate`` unchanged, with the real demo model (embedded engine)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from toolrollout.rollout import read_rows

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "120"}

# verl's gsm8k_tool_config.yaml entry, next to the demo calculator the demo model uses.
TOOL_CONFIG = """tools:
  - class_name: "toolrollout.tools.CalculatorTool"
    config: {type: native}
  - class_name: "verl.tools.gsm8k_tool.Gsm8kTool"
    config:
      type: native
    tool_schema:
      type: "function"
      function:
        name: "calc_gsm8k_reward"
        description: "A tool for calculating the reward of gsm8k."
        parameters:
          type: "object"
          properties:
            answer:
              type: "string"
              description: "The model's answer to the GSM8K math problem, must be a digits"
          required: ["answer"]
"""

# verl's gsm8k_interaction_config.yaml entry, plus the demo grader.
INTERACTION_CONFIG = """interaction:
  - name: "gsm8k"
    class_name: "verl.interactions.gsm8k_interaction.Gsm8kInteraction"
    config: {}
  - name: "grader"
    class_name: "toolrollout.interactions.GraderInteraction"
    config: {max_retries: 1}
"""

QUESTIONS = [("Multiply 4 by 341.", "1364"), ("What is 629 minus 85?", "544")]


def verl_row(index: int, question: str, answer: str, interaction: str) -> dict[str, Any]:
    """One row exactly as verl's gsm8k multi-turn preprocessing lays it out."""
    return {
        "data_source": "demo/arithmetic",
        "agent_name": "tool_agent",
        "prompt": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": question},
        ],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {
            "split": "test",
            "index": index,
            "need_tools_kwargs": True,
            "tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": answer}}},
            "interaction_kwargs": {"name": interaction, "query": question, "ground_truth": answer},
        },
    }


@pytest.mark.slow
def test_verl_dataset_and_configs_run_unchanged(tmp_path: Path) -> None:
    rows = [
        verl_row(i, q, a, name)
        for i, ((q, a), name) in enumerate(
            [(QUESTIONS[0], "grader"), (QUESTIONS[1], "grader"), (QUESTIONS[0], "gsm8k")]
        )
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    (tmp_path / "tools.yaml").write_text(TOOL_CONFIG)
    (tmp_path / "interaction.yaml").write_text(INTERACTION_CONFIG)
    proc = subprocess.run(
        [
            sys.executable, "-m", "toolrollout", "generate",
            "--dataset", "train.parquet",
            "--tool-config", "tools.yaml",
            "--interaction-config", "interaction.yaml",
            "--max-turns", "4", "--max-interaction-turns", "2", "--seed", "5",
            "--turn-reward-weight", "0.5", "--tool-reward-weight", "1.0",
            "--out", "out.parquet",
        ],
        cwd=tmp_path, capture_output=True, text=True, env=ENV, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = read_rows(tmp_path / "out.parquet")
    assert len(out) == 3
    for row in out:
        assert row["status"] in {"completed", "truncated"}, row["error"]
        assert row["metrics"]["drift_mismatches"] == 0
        assert len(row["response_ids"]) == len(row["loss_mask"]) == len(row["rollout_logprobs"])
        assert len(row["turn_rewards"]) == len(row["tool_rewards"]) == row["num_turns"]
        # The gsm8k tool instance was created from the row's create_kwargs and scored.
        assert set(row["tool_final_rewards"]) == {"calc_gsm8k_reward"}
        assert row["metrics"]["interaction_turns"] >= 1
        if row["status"] == "completed":  # the interaction scored the final turn
            assert row["turn_rewards"][-1] is not None
        # The reward follows the documented rule: outcome + 0.5 * turns + 1.0 * tools.
        turns = sum(r for r in row["turn_rewards"] if r is not None)
        tools = sum(r for r in row["tool_rewards"] if r is not None)
        tools += sum(row["tool_final_rewards"].values())
        outcome = row["metrics"]["reward_terms"]["numeric_match"]
        assert row["reward"] == pytest.approx(outcome + 0.5 * turns + 1.0 * tools)
    # verl's strict gsm8k grader never sees "#### <n>" from the demo model: it asks again,
    # so user turns were appended (masked out) until the turn budget ended the trajectory.
    strict = out[2]
    user_turns = [m for m in strict["messages"][2:] if m["role"] == "user"]
    # Every reply of the grader is counted; the one that meets a spent budget is scored but
    # not appended (the trajectory ends there), the others are in the transcript.
    replies = strict["metrics"]["interaction_turns"]
    assert strict["num_turns"] >= 2 and 1 <= len(user_turns) and replies - 1 <= len(user_turns)
    assert len(user_turns) <= replies
    assert strict["status"] == "truncated" and 0.0 in strict["turn_rewards"]
    masked = strict["loss_mask"].count(0)
    assert masked >= strict["metrics"]["interaction_tokens"] > 0
    assert strict["messages"][1]["content"] == QUESTIONS[0][0]


def test_unknown_interaction_name_is_one_line_before_the_engine_starts(tmp_path: Path) -> None:
    rows = [verl_row(0, *QUESTIONS[0], "tutor")]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    (tmp_path / "interaction.yaml").write_text(INTERACTION_CONFIG)
    proc = subprocess.run(
        [
            sys.executable, "-m", "toolrollout", "generate",
            "--dataset", "train.parquet", "--interaction-config", "interaction.yaml",
        ],
        cwd=tmp_path, capture_output=True, text=True, env=ENV, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()
    assert line == (
        "error: train.parquet row 0: interaction_kwargs.name 'tutor' is not configured; "
        "available: grader, gsm8k"
    )
