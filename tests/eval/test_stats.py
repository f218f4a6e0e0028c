"""pass@k against brute-force enumeration; bootstrap intervals and their pairing."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolrollout import UserError
from toolrollout.apps.eval import bootstrap_difference, bootstrap_mean
from toolrollout.apps.eval._stats import pass_at_k
from toolrollout.apps.eval._summary import default_ks


@given(st.integers(1, 9).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n))), st.data())
def test_pass_at_k_is_the_chance_a_random_k_subset_holds_a_correct_sample(
    nc: tuple[int, int], data: st.DataObject
) -> None:
    n, c = nc
    k = data.draw(st.integers(1, n))
    outcomes = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(outcomes, k))
    expected = sum(any(s) for s in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_1_is_the_fraction_correct_and_pass_at_n_is_any_correct() -> None:
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(10, 1, 10) == 1.0
    assert pass_at_k(10, 0, 10) == 0.0


@pytest.mark.parametrize(("n", "c", "k"), [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)])
def test_pass_at_k_rejects_impossible_counts(n: int, c: int, k: int) -> None:
    with pytest.raises(UserError):
        pass_at_k(n, c, k)


def test_default_ks() -> None:
    assert default_ks(1) == [1]
    assert default_ks(5) == [1, 2, 4, 5]
    assert default_ks(8) == [1, 2, 4, 8]


def test_bootstrap_mean_brackets_the_mean_and_is_reproducible() -> None:
    values = [0.0, 1.0, 1.0, 0.5, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    interval = bootstrap_mean(values, seed=7)
    assert interval.estimate == pytest.approx(0.65)
    assert interval.low < 0.65 < interval.high
    assert 0.0 <= interval.low and interval.high <= 1.0
    assert bootstrap_mean(values, seed=7) == interval
    narrow = bootstrap_mean(values, confidence=0.5, seed=7)
    assert interval.low <= narrow.low <= narrow.high <= interval.high
    assert bootstrap_mean([1.0] * 5).low == 1.0


def test_paired_difference_removes_problem_difficulty() -> None:
    # Problem difficulty varies a lot; "after" is better by 0.2 on every problem.
    before = {i: (i % 5) / 5 for i in range(40)}
    after = {i: v + 0.2 for i, v in before.items()}
    paired = bootstrap_difference(after, before, seed=1)
    assert paired.paired
    assert paired.estimate == pytest.approx(0.2)
    assert paired.low == pytest.approx(0.2) and paired.high == pytest.approx(0.2)
    # Different problem sets: independent resampling, so the interval is wide.
    shifted = {i + 100: v for i, v in after.items()}
    unpaired = bootstrap_difference(shifted, before, seed=1)
    assert not unpaired.paired
    assert unpaired.estimate == pytest.approx(0.2)
    assert unpaired.low < 0.15 and unpaired.high > 0.25


def test_bootstrap_rejects_bad_settings() -> None:
    with pytest.raises(UserError):
        bootstrap_mean([], seed=0)
    with pytest.raises(UserError):
        bootstrap_mean([1.0], confidence=1.5)
    with pytest.raises(UserError):
        bootstrap_difference({}, {0: 1.0})
