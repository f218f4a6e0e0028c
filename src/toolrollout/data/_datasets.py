"""Dataset loading at the edge: every problem becomes a one-line :class:`UserError`.

Accepted rows (JSONL or parquet):

* toolrollout's own layout: ``messages`` (OpenAI messages) and optionally ``answer`` or
  ``ground_truth``;
* verl's RL parquet layout: ``prompt`` (messages) and ``reward_model.ground_truth``; other
  columns (``extra_info``, ``data_source``...) are kept as metadata for tools and rewards.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from toolrollout._exceptions import UserError
from toolrollout._jsonarg import jsonl_objects
from toolrollout._records import RolloutPrompt

__all__ = ["load_prompts"]

_ROLES = {"system", "user", "assistant", "tool"}


def _read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise UserError(f"dataset not found: {path}")
    suffix = path.suffix.lower()
    if suffix in {".jsonl", ".json"}:
        with path.open("rb") as fh:
            return [row for _, row in jsonl_objects(fh, str(path))]
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return list(pq.read_table(path).to_pylist())
        except Exception as exc:  # pyarrow raises several unrelated types here
            raise UserError(f"{path}: cannot read parquet ({exc})") from exc
    raise UserError(f"{path}: unsupported dataset format {suffix!r} (use .jsonl or .parquet)")


def _row_to_prompt(row: dict[str, Any], where: str) -> RolloutPrompt:
    messages = row.get("messages", row.get("prompt"))
    if messages is None:
        raise UserError(f"{where}: missing column 'messages' (or verl's 'prompt')")
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    if not isinstance(messages, list) or not messages:
        raise UserError(f"{where}: 'messages' must be a non-empty list of messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            raise UserError(f"{where}: messages[{i}] needs a role among {sorted(_ROLES)}")
        if not isinstance(message.get("content", ""), str | list):
            raise UserError(f"{where}: messages[{i}].content must be a string")
    truth = row.get("ground_truth", row.get("answer"))
    reward_model = row.get("reward_model")
    if truth is None and isinstance(reward_model, dict):
        truth = reward_model.get("ground_truth")
    metadata = {
        k: v for k, v in row.items() if k not in {"messages", "prompt", "ground_truth", "answer"}
    }
    return RolloutPrompt(tuple(dict(m) for m in messages), truth, metadata)


def load_prompts(path: str | Path, *, limit: int | None = None) -> list[RolloutPrompt]:
    """Load prompts from ``path``; ``limit`` keeps the first rows only."""
    path = Path(path)
    rows = _read_rows(path)
    if limit is not None:
        rows = rows[:limit]
    if not rows:
        raise UserError(f"{path}: the dataset has no rows")
    return [_row_to_prompt(row, f"{path} row {i}") for i, row in enumerate(rows)]
