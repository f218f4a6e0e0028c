"""Where the trajectory records used to live; they are in :mod:`toolrollout._records` now.

Kept for leftover files pickled before the move (they name
``toolrollout.rollout._trajectory.Trajectory``); new code imports ``toolrollout._records``.
"""

from toolrollout._records import SpanKind as SpanKind
from toolrollout._records import TokenSpan as TokenSpan
from toolrollout._records import Trajectory as Trajectory
from toolrollout._records import TrajectoryStatus as TrajectoryStatus

__all__ = ["SpanKind", "TokenSpan", "Trajectory", "TrajectoryStatus"]
