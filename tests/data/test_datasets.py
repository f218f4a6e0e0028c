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
        ("[1, 2]\n", "expected a JSON object, got list"),
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


def test_verl_multi_turn_columns_reach_tools_and_interactions(tmp_path: Path) -> None:
    """extra_info.tools_kwargs / interaction_kwargs and agent_name are carried through; a
    tool absent from a row reads back as None from parquet's shared struct and counts as
    "no kwargs"."""
    from toolrollout.tools import tool_kwargs
    from toolrollout.tools._lifecycle import row_kwargs

    def verl_row(tool: str, truth: str) -> dict[str, object]:
        return {
            "data_source": "openai/gsm8k",
            "agent_name": "tool_agent",
            "prompt": [{"role": "user", "content": "Q"}],
            "reward_model": {"style": "rule", "ground_truth": truth},
            "extra_info": {
                "index": 0,
                "tools_kwargs": {tool: {"create_kwargs": {"ground_truth": truth}}},
                "interaction_kwargs": {"name": "gsm8k", "ground_truth": truth},
            },
        }

    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist([verl_row("a", "1"), verl_row("b", "2")]), path)
    first, second = load_prompts(path)
    assert first.metadata["agent_name"] == "tool_agent"
    assert tool_kwargs(first.metadata, "a", "create_kwargs") == {"ground_truth": "1"}
    assert first.metadata["extra_info"]["tools_kwargs"]["b"] is None
    assert tool_kwargs(first.metadata, "b", "create_kwargs") == {}
    assert tool_kwargs(second.metadata, "b", "create_kwargs") == {"ground_truth": "2"}
    assert row_kwargs(second.metadata, "interaction_kwargs") == {
        "name": "gsm8k",
        "ground_truth": "2",
    }
