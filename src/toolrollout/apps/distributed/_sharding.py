"""Which prompts each Ray worker rolls out."""

from __future__ import annotations

from toolrollout._exceptions import UserError

__all__ = ["shard_prompts"]


def shard_prompts(num_prompts: int, num_shards: int) -> list[tuple[int, ...]]:
    """Deal prompt indices round-robin over ``num_shards`` shards: prompt ``i`` goes to
    shard ``i % num_shards``.

    A prompt is the unit, so every sample of a GRPO group lands in the same shard (its
    group is rolled out by one worker and its rows are never split). Dealing rather than
    cutting in blocks spreads a dataset sorted by difficulty or length evenly. The result
    depends only on the two counts, so a rerun or ``--resume`` gives each shard the same
    prompts.
    """
    if num_shards < 1:
        raise UserError(f"need at least one shard, got {num_shards}")
    if num_prompts < 0:
        raise UserError(f"negative prompt count {num_prompts}")
    return [tuple(range(shard, num_prompts, num_shards)) for shard in range(num_shards)]
