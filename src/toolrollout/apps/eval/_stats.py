"""Statistics of evaluation: pass@k and bootstrap confidence intervals (docs/eval.md).

pass@k is the unbiased estimator of Chen et al. (2021). Confidence intervals resample
problems (not samples), since samples of one problem are correlated, paired when two runs
share their problems.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from toolrollout._exceptions import UserError

__all__ = ["Interval", "bootstrap_difference", "bootstrap_mean", "pass_at_k"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with ``c`` correct out of ``n`` samples."""
    if not 0 <= c <= n:
        raise UserError(f"pass@k needs 0 <= c <= n, got c={c}, n={n}")
    if not 1 <= k <= n:
        raise UserError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    # C(n-c, k) / C(n, k) as a product: no huge binomials, no overflow.
    ratio = 1.0
    for i in range(n - c + 1, n + 1):
        ratio *= 1.0 - k / i
    return 1.0 - ratio


@dataclass(frozen=True, slots=True)
class Interval:
    """A point estimate with its percentile bootstrap interval."""

    estimate: float
    low: float
    high: float
    confidence: float
    resamples: int
    paired: bool = False


def _check(confidence: float, resamples: int) -> None:
    if not 0.0 < confidence < 1.0:
        raise UserError(f"confidence must be between 0 and 1, got {confidence}")
    if resamples < 1:
        raise UserError(f"resamples must be at least 1, got {resamples}")


def _resampled_means(data: np.ndarray, rng: np.random.Generator, resamples: int) -> np.ndarray:
    means: np.ndarray = data[rng.integers(0, data.size, size=(resamples, data.size))].mean(axis=1)
    return means


def _percentiles(draws: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(draws, [tail, 1.0 - tail])
    return float(low), float(high)


def bootstrap_mean(
    values: Sequence[float], *, confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> Interval:
    """Percentile interval of the mean of per-problem ``values``."""
    _check(confidence, resamples)
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        raise UserError("cannot bootstrap an empty set of problems")
    draws = _resampled_means(data, np.random.default_rng(seed), resamples)
    return Interval(float(data.mean()), *_percentiles(draws, confidence), confidence, resamples)


def bootstrap_difference(
    a: Mapping[int, float],
    b: Mapping[int, float],
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> Interval:
    """Interval of ``mean(a) - mean(b)`` over per-problem scores keyed by problem.

    Paired (one resampled index set for both) when both runs scored the same problems,
    independent resampling of each run otherwise.
    """
    _check(confidence, resamples)
    if not a or not b:
        raise UserError("cannot compare runs when one of them has no problems")
    if set(a) == set(b):
        diff = [a[k] - b[k] for k in sorted(a)]
        interval = bootstrap_mean(diff, confidence=confidence, resamples=resamples, seed=seed)
        return replace(interval, paired=True)
    rng = np.random.default_rng(seed)
    xa = np.asarray(list(a.values()), dtype=float)
    xb = np.asarray(list(b.values()), dtype=float)
    draws = _resampled_means(xa, rng, resamples) - _resampled_means(xb, rng, resamples)
    low, high = _percentiles(draws, confidence)
    return Interval(float(xa.mean() - xb.mean()), low, high, confidence, resamples)
