"""The SFT recipe of docs/trainers.md builds ``input_ids`` as prompt + response ids.

The block is taken from the page as it is and run on a small trajectory file whose rows
have prompts and responses of unequal and of equal lengths: the old recipe crashed on the
first ("cannot do arithmetic operation on series of different lengths") and silently
added the ids element by element on the second.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tests.docs._blocks import read_blocks

ROWS: list[dict[str, Any]] = [
    # group 0: the better of two completed rows is kept; prompt 3 ids, response 5 ids
    {
        "group_id": 0,
        "status": "completed",
        "reward": 1.0,
        "prompt_ids": [1, 2, 3],
        "response_ids": [10, 11, 12, 13, 14],
        "loss_mask": [1, 1, 0, 0, 1],
    },
    {
        "group_id": 0,
        "status": "completed",
        "reward": 0.0,
        "prompt_ids": [1, 2, 3],
        "response_ids": [20, 21],
        "loss_mask": [1, 1],
    },
    # group 1: equal lengths (4 and 4), where element-wise addition would go unnoticed
    {
        "group_id": 1,
        "status": "completed",
        "reward": 1.5,
        "prompt_ids": [5, 6, 7, 8],
        "response_ids": [30, 31, 32, 33],
        "loss_mask": [1, 0, 1, 1],
    },
    {
        "group_id": 1,
        "status": "completed",
        "reward": 1.0,
        "prompt_ids": [5, 6, 7, 8],
        "response_ids": [40, 41, 42, 43],
        "loss_mask": [1, 1, 1, 1],
    },
    # group 2: nothing good enough (a failure, a low reward)
    {
        "group_id": 2,
        "status": "failed",
        "reward": None,
        "prompt_ids": [9],
        "response_ids": [],
        "loss_mask": [],
    },
    {
        "group_id": 2,
        "status": "truncated",
        "reward": 1.0,
        "prompt_ids": [9],
        "response_ids": [50],
        "loss_mask": [1],
    },
]


def _recipe() -> str:
    (block,) = [b for b in read_blocks("docs/trainers.md") if b.first_line == "import polars as pl"]
    return block.code


def test_sft_recipe_concatenates_prompt_and_response(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    columns = {key: [row[key] for row in ROWS] for key in ROWS[0]}
    pq.write_table(pa.table(columns), tmp_path / "rollouts.parquet")
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {}
    exec(compile(_recipe(), "docs/trainers.md", "exec"), namespace)
    sft = namespace["sft"]
    # one example per group with a good row: the best of group 0 and of group 1
    assert sorted(sft, key=lambda example: example["input_ids"]) == [
        {
            "input_ids": [1, 2, 3, 10, 11, 12, 13, 14],
            "labels": [-100, -100, -100, 10, 11, -100, -100, 14],
        },
        {
            "input_ids": [5, 6, 7, 8, 30, 31, 32, 33],
            "labels": [-100, -100, -100, -100, 30, -100, 32, 33],
        },
    ]
    for example in sft:
        assert all(isinstance(token, int) for token in example["input_ids"])
        assert len(example["input_ids"]) == len(example["labels"])
