"""Reward functions over finished trajectories (outcome and tool-use shaping), and the
:class:`RewardMix` rule that combines them with interaction turn and tool rewards."""

from ._base import RewardFunction as RewardFunction
from ._base import WeightedReward as WeightedReward
from ._base import combine as combine
from ._base import evaluate_terms as evaluate_terms
from ._base import exact_match as exact_match
from ._base import final_answer_text as final_answer_text
from ._base import numeric_match as numeric_match
from ._base import tool_error_penalty as tool_error_penalty
from ._mix import RewardMix as RewardMix

__all__ = [
    "RewardFunction",
    "RewardMix",
    "WeightedReward",
    "combine",
    "evaluate_terms",
    "exact_match",
    "final_answer_text",
    "numeric_match",
    "tool_error_penalty",
]
