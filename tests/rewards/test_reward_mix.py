"""The documented rule combining outcome, interaction turn and tool rewards."""

from __future__ import annotations

import pytest

from toolrollout import UserError
from toolrollout.rewards import RewardMix


def test_default_mix_keeps_the_outcome_and_records_the_rest() -> None:
    reward, terms = RewardMix().combine(0.5, [None, 1.0], [0.25, None], {"grader": 1.0})
    assert reward == 0.5
    assert terms == {"turn_rewards": 1.0, "tool_rewards": 1.25}


def test_weights_and_reductions() -> None:
    mix = RewardMix(outcome_weight=2.0, turn_weight=0.5, tool_weight=-1.0, turn_reduce="mean")
    reward, terms = mix.combine(1.0, [0.0, 1.0, None], [0.1, 0.2], {})
    assert terms == {"turn_rewards": 0.5, "tool_rewards": pytest.approx(0.3)}
    assert reward == pytest.approx(2.0 * 1.0 + 0.5 * 0.5 - 1.0 * 0.3)
    last = RewardMix(turn_weight=1.0, outcome_weight=0.0, turn_reduce="last")
    assert last.combine(1.0, [0.0, 0.25], [], {}) == (0.25, {"turn_rewards": 0.25})


def test_absent_terms_give_no_reward() -> None:
    assert RewardMix(turn_weight=1.0).combine(None, [None], [None], {}) == (None, {})
    # A present term with weight 0 does not make a reward either.
    assert RewardMix().combine(None, [1.0], [], {}) == (None, {"turn_rewards": 1.0})


@pytest.mark.parametrize(
    "kwargs",
    [{"turn_weight": float("nan")}, {"tool_reduce": "median"}, {"outcome_weight": float("inf")}],
)
def test_bad_settings_are_user_errors(kwargs: dict[str, object]) -> None:
    with pytest.raises(UserError):
        RewardMix(**kwargs)  # type: ignore[arg-type]
