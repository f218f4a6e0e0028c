from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from toolrollout import UserError
from toolrollout.data import load_prompts


def test_jsonl_rows_with_answer(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": "1+1?"}], "answer": "2", "topic": "math"},
        {"messages": [{"role": "user", "content": "2+2?"}], "ground_truth": "4"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    prompts = load_prompts(path)
    assert [p.ground_truth for p in prompts] == ["2", "4"]
    assert prompts[0].messages[0]["content"] == "1+1?"
    assert prompts[0].metadata == {"topic": "math"}
    assert len(load_prompts(path, limit=1)) == 1


def test_verl_rl_parquet_layout(tmp_path: Path) -> None:
    """verl's RL parquet: `prompt` messages, `reward_model.ground_truth`, extra_info kept."""
    table = pa.Table.from_pylist(
        [
            {
                "data_source": "openai/gsm8k",
                "prompt": [{"role": "user", "content": "What is 6 * 7?"}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": "42"},
                "extra_info": {"index": 0, "split": "train"},
            }
        ]
    )
    path = tmp_path / "train.parquet"
    pq.write_table(table, path)
    [prompt] = load_prompts(path)
    assert prompt.ground_truth == "42"
    assert prompt.messages == ({"role": "user", "content": "What is 6 * 7?"},)
    assert prompt.metadata["data_source"] == "openai/gsm8k"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"question": "no messages"}\n', "missing column 'messages'"),
        ('{"messages": "hi"}\n{"messages": []}\n', "row 1: 'messages' must be a non-empty list"),
        ('{"messages": [{"role": "wizard", "content": "x"}]}\n', "messages[0] needs a role"),
        ('{"messages": [{"role": "user", "content": 5}]}\n', "content must be a string"),
        ("not json\n", "p.jsonl:1: invalid JSON"),
        ("[1, 2]\n", "each line must be a JSON object"),
        ("", "has no rows"),
    ],
)
def test_bad_rows_are_one_line_user_errors(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(content)
    with pytest.raises(UserError, match=message.replace("[", r"\[").replace("]", r"\]")) as info:
        load_prompts(path)
    assert "\n" not in str(info.value)


def test_missing_and_unsupported_files(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="dataset not found"):
        load_prompts(tmp_path / "nope.jsonl")
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(UserError, match="unsupported dataset format"):
        load_prompts(tmp_path / "x.csv")
