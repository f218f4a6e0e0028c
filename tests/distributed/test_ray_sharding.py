"""How prompts are dealt to Ray workers: whole groups, every prompt once, stable."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolrollout._exceptions import UserError
from toolrollout.apps.distributed import shard_prompts


@given(st.integers(min_value=0, max_value=500), st.integers(min_value=1, max_value=17))
def test_every_prompt_lands_in_exactly_one_shard(num_prompts: int, num_shards: int) -> None:
    shards = shard_prompts(num_prompts, num_shards)
    assert len(shards) == num_shards
    dealt = sorted(i for shard in shards for i in shard)
    assert dealt == list(range(num_prompts))
    sizes = [len(shard) for shard in shards]
    assert max(sizes) - min(sizes) <= 1  # balanced to one prompt
    assert shards == shard_prompts(num_prompts, num_shards)  # a rerun deals the same


def test_round_robin_spreads_a_sorted_dataset() -> None:
    assert shard_prompts(7, 3) == [(0, 3, 6), (1, 4), (2, 5)]


def test_more_shards_than_prompts_leaves_some_empty() -> None:
    assert shard_prompts(2, 4) == [(0,), (1,), (), ()]


def test_zero_shards_is_a_user_error() -> None:
    with pytest.raises(UserError, match="at least one shard"):
        shard_prompts(3, 0)
