"""toolrollout output -> verl's padded rollout batch.

The same fixed-width tensors verl's agent loop builds (``_agent_loop_postprocess``), from a
``toolrollout generate`` file, so verl can train on offline or rejection-sampled rollouts.
torch is imported when a batch is built, never at import.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolrollout._exceptions import UserError
from toolrollout.rollout import Trajectory, read_rows

__all__ = ["VerlBatch", "to_verl_batch"]

TENSOR_KEYS = (
    "prompts",
    "responses",
    "response_mask",
    "input_ids",
    "attention_mask",
    "position_ids",
    "rollout_log_probs",
)


@dataclass(frozen=True, slots=True)
class VerlBatch:
    """The tensors and per-row arrays of a verl ``DataProto``.

    ``rm_scores`` (the reward on the last response token) only when every row has a reward;
    ``non_tensors`` has ``uid`` (the GRPO group). ``meta_info["temperature"]`` is the rows'
    own: verl's actor divides the logits by it when it recomputes the old logprobs.
    """

    tensors: dict[str, Any]
    non_tensors: dict[str, Any]
    meta_info: dict[str, Any] = field(default_factory=dict)

    def to_dataproto(self, meta_info: Mapping[str, Any] | None = None) -> Any:
        """verl's own ``DataProto`` (needs ``verl`` installed), with :attr:`meta_info` and
        then ``meta_info``; a ``temperature`` there that is not the rows' is refused."""
        given = dict(meta_info or {})
        sampled = self.meta_info.get("temperature")
        if sampled is not None and given.get("temperature", sampled) != sampled:
            raise UserError(
                f"meta_info temperature {given['temperature']} is not the rows' sampling "
                f"temperature {sampled}: old-policy logprobs would come from another "
                "distribution than the rollout's"
            )
        try:
            from tensordict import TensorDict
            from verl.protocol import DataProto
        except ImportError as exc:
            raise UserError("to_dataproto needs verl: pip install 'toolrollout[verl]'") from exc
        size = len(self.tensors["prompts"])
        return DataProto(
            batch=TensorDict(dict(self.tensors), batch_size=size),
            non_tensor_batch=dict(self.non_tensors),
            meta_info={**self.meta_info, **given},
        )


def _rows(
    source: str | Path | Iterable[Trajectory | Mapping[str, Any]],
) -> list[Mapping[str, Any]]:
    if isinstance(source, str | Path):
        return list(read_rows(source))
    return [item.to_row() if isinstance(item, Trajectory) else item for item in source]


def _num_turns(row: Mapping[str, Any]) -> int:
    """verl's count (``ToolAgentLoop``): assistant turns + user turns (each run of
    non-assistant messages after the first assistant one) + 1."""
    messages = row.get("messages")
    if isinstance(messages, str):
        messages = json.loads(messages)
    if not isinstance(messages, Sequence):
        return int(row.get("num_turns", 0))
    roles = [m.get("role") for m in messages]
    if "assistant" not in roles:
        return 1
    first = roles.index("assistant")
    assistant = roles.count("assistant")
    user = sum(
        1
        for i in range(first + 1, len(roles))
        if roles[i] != "assistant" and roles[i - 1] == "assistant"
    )
    return assistant + user + 1


def to_verl_batch(
    source: str | Path | Iterable[Trajectory | Mapping[str, Any]],
    *,
    prompt_length: int,
    response_length: int,
    pad_token_id: int,
    include_failed: bool = False,
) -> VerlBatch:
    """Pad toolrollout rows (a parquet/JSONL path, rows, or trajectories) into verl's layout.

    Overlong prompts keep their last tokens, responses their first, as verl's agent loops
    do. Failed rows are dropped unless ``include_failed``.
    """
    import numpy as np
    import torch

    if prompt_length < 1 or response_length < 1:
        raise UserError("prompt_length and response_length must be at least 1")
    rows = [r for r in _rows(source) if include_failed or not r.get("failed", False)]
    if not rows:
        raise UserError("no rows to convert (all failed, or the input is empty)")
    size = len(rows)
    prompts = torch.full((size, prompt_length), pad_token_id, dtype=torch.long)
    prompt_attn = torch.zeros((size, prompt_length), dtype=torch.long)
    responses = torch.full((size, response_length), pad_token_id, dtype=torch.long)
    response_attn = torch.zeros((size, response_length), dtype=torch.long)
    response_mask = torch.zeros((size, response_length), dtype=torch.long)
    logprobs = torch.zeros((size, response_length), dtype=torch.float32)
    for i, row in enumerate(rows):
        p_ids = list(row["prompt_ids"])[-prompt_length:]
        r_ids = list(row["response_ids"])[:response_length]
        mask = list(row["loss_mask"])[:response_length]
        lps = list(row["rollout_logprobs"])[:response_length]
        if not (len(r_ids) == len(mask) == len(lps)):
            raise UserError(
                f"row {row.get('uid', i)}: response_ids, loss_mask and rollout_logprobs "
                "differ in length"
            )
        if p_ids:
            prompts[i, prompt_length - len(p_ids) :] = torch.tensor(p_ids, dtype=torch.long)
            prompt_attn[i, prompt_length - len(p_ids) :] = 1
        n = len(r_ids)
        if n:
            responses[i, :n] = torch.tensor(r_ids, dtype=torch.long)
            response_attn[i, :n] = 1
            response_mask[i, :n] = torch.tensor(mask, dtype=torch.long)
            logprobs[i, :n] = torch.tensor(lps, dtype=torch.float32)
    attention_mask = torch.cat([prompt_attn, response_attn], dim=1)
    # verl.utils.model.compute_position_id_with_mask: positions count real tokens only.
    position_ids = torch.clip(torch.cumsum(attention_mask, dim=-1) - 1, min=0)
    tensors: dict[str, Any] = {
        "prompts": prompts,
        "responses": responses,
        "response_mask": response_mask * response_attn,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "rollout_log_probs": logprobs,
    }
    rewards = [row.get("reward") for row in rows]
    if all(r is not None for r in rewards):
        last = response_attn.sum(dim=1) - 1
        rm_scores = torch.zeros((size, response_length), dtype=torch.float32)
        rm_scores[torch.arange(size), last] = torch.tensor(rewards, dtype=torch.float32)
        tensors["rm_scores"] = rm_scores
    non_tensors = {
        "uid": np.array([str(r.get("group_id", i)) for i, r in enumerate(rows)], dtype=object),
        "__num_turns__": np.array([_num_turns(r) for r in rows], dtype=np.int32),
        "reward": np.array(rewards, dtype=object),
        "status": np.array([r.get("status") for r in rows], dtype=object),
        "num_tool_calls": np.array([int(r.get("num_tool_calls", 0)) for r in rows], dtype=np.int32),
    }
    return VerlBatch(tensors=tensors, non_tensors=non_tensors, meta_info=_sampled_at(rows))


def _sampled_at(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``{"temperature": t}`` when the rows record one sampling temperature (rows from
    before toolrollout recorded it: nothing); rows sampled at several are refused, since a
    verl batch has one."""
    temperatures = {
        float(sampling["temperature"])
        for row in rows
        if isinstance(sampling := row.get("sampling"), Mapping)
        and sampling.get("temperature") is not None
    }
    if len(temperatures) > 1:
        raise UserError(
            f"the rows were sampled at temperatures {sorted(temperatures)}: a verl batch "
            "recomputes old-policy logprobs at one; convert each temperature's rows apart"
        )
    return {"temperature": temperatures.pop()} if temperatures else {}
