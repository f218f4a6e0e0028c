"""The parquet -> verl batch converter on hand-built rows (verl's own padding is compared in
test_verl.py; this covers turn counting, cuts, failed rows and bad input without verl)."""

from __future__ import annotations

import json

import pytest

from toolrollout import UserError
from toolrollout.integrations import to_verl_batch


def _row(
    uid: str, prompt: list[int], response: list[int], mask: list[int], **extra: object
) -> dict[str, object]:
    messages = extra.pop("messages", [{"role": "user", "content": "q"}])
    return {
        "uid": uid,
        "group_id": "g0",
        "prompt_ids": prompt,
        "response_ids": response,
        "loss_mask": mask,
        "rollout_logprobs": [-0.5 if m else 0.0 for m in mask],
        "messages": json.dumps(messages),
        "reward": extra.pop("reward", 1.0),
        "status": "completed",
        "num_tool_calls": 1,
        "failed": extra.pop("failed", False),
    }


def test_turns_cuts_and_failed_rows() -> None:
    torch = pytest.importorskip("torch")
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "call"},
        {"role": "tool", "content": "3"},
        {"role": "tool", "content": "4"},
        {"role": "assistant", "content": "answer"},
        {"role": "user", "content": "try again"},  # an interaction turn
        {"role": "assistant", "content": "final"},
    ]
    rows = [
        _row("a", [1, 2, 3, 4, 5], [6, 7, 8, 9], [1, 0, 0, 1], messages=messages),
        _row("b", [1], [6], [1], failed=True, reward=None),
    ]
    batch = to_verl_batch(rows, prompt_length=3, response_length=3, pad_token_id=0)
    t = batch.tensors
    assert t["prompts"].tolist() == [[3, 4, 5]]  # left-truncated, like verl's prompt cap
    assert t["responses"].tolist() == [[6, 7, 8]]
    assert t["response_mask"].tolist() == [[1, 0, 0]]
    assert t["rollout_log_probs"].tolist() == [[-0.5, 0.0, 0.0]]
    assert t["position_ids"].tolist() == [[0, 1, 2, 3, 4, 5]]
    assert t["rm_scores"][0, 2].item() == 1.0 and t["rm_scores"].sum().item() == 1.0
    assert torch.equal(t["input_ids"], torch.cat([t["prompts"], t["responses"]], dim=1))
    # 3 assistant turns + 2 user turns (a tool round, an interaction message) + 1.
    assert batch.non_tensors["__num_turns__"].tolist() == [6]
    kept = to_verl_batch(
        rows, prompt_length=4, response_length=5, pad_token_id=0, include_failed=True
    )
    assert kept.tensors["prompts"].tolist()[1] == [0, 0, 0, 1]
    assert kept.tensors["attention_mask"].tolist()[1] == [0, 0, 0, 1, 1, 0, 0, 0, 0]
    assert "rm_scores" not in kept.tensors  # one row has no reward


def test_bad_input_is_a_clear_error() -> None:
    pytest.importorskip("torch")
    with pytest.raises(UserError, match="no rows"):
        to_verl_batch([], prompt_length=4, response_length=4, pad_token_id=0)
    bad = _row("x", [1], [2, 3], [1])
    with pytest.raises(UserError, match="differ in length"):
        to_verl_batch([bad], prompt_length=4, response_length=4, pad_token_id=0)


def test_the_rows_sampling_temperature_goes_to_meta_info() -> None:
    pytest.importorskip("torch")
    from toolrollout.rollout import RolloutConfig, Trajectory, TrajectoryStatus
    from toolrollout.rollout._state import sampling_record

    def trajectory(uid: str, temperature: float) -> Trajectory:
        from toolrollout.engines import SamplingParams

        config = RolloutConfig(sampling=SamplingParams(temperature=temperature), seed=1)
        return Trajectory(
            uid=uid,
            group_id="g",
            prompt_index=0,
            sample_index=0,
            prompt_ids=(1, 2),
            spans=(),
            messages=({"role": "user", "content": "q"},),
            status=TrajectoryStatus.COMPLETED,
            finish_reason="stop",
            sampling=sampling_record(config),
        )

    # Rows as a file gives them back: the sampling column holds what Trajectory recorded.
    rows = [trajectory("a", 0.6).to_row(), trajectory("b", 0.6).to_row()]
    batch = to_verl_batch(rows, prompt_length=2, response_length=2, pad_token_id=0)
    assert batch.meta_info == {"temperature": 0.6}
    # verl's actor divides logits by meta_info["temperature"]: another one is refused.
    with pytest.raises(UserError, match=r"not the rows' sampling temperature 0\.6"):
        batch.to_dataproto({"temperature": 1.0})
    mixed = [*rows, trajectory("c", 1.0).to_row()]
    with pytest.raises(UserError, match=r"temperatures \[0.6, 1.0\]"):
        to_verl_batch(mixed, prompt_length=2, response_length=2, pad_token_id=0)
    # Rows from before toolrollout recorded it: nothing is claimed.
    old = [{**row, "sampling": None} for row in rows]
    assert to_verl_batch(old, prompt_length=2, response_length=2, pad_token_id=0).meta_info == {}
