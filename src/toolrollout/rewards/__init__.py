"""Reward functions over finished trajectories (outcome and tool-use shaping), and the
:class:`RewardMix` rule that combines them with interaction turn and tool rewards."""

from ._base import RewardFunction as RewardFunction
from ._base import WeightedReward as WeightedReward
from ._base import combine as combine
from ._base import exact_match as exact_match
from ._base import numeric_match as numeric_match
from ._base import tool_error_penalty as tool_error_penalty
from ._mix import RewardMix as RewardMix

__all__ = [
    "RewardFunction",
    "RewardMix",
    "WeightedReward",
    "combine",
    "exact_match",
    "numeric_match",
    "tool_error_penalty",
]
