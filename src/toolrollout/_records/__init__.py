"""The records every layer shares: trajectories, their token spans, statuses and images.

A leaf: it imports nothing from the rest of toolrollout, so reward functions, metrics,
writers and trainer adapters can use these types without importing the rollout loop. The
public names are re-exported by :mod:`toolrollout.rollout`.
"""

from ._trajectory import SpanKind as SpanKind
from ._trajectory import TokenSpan as TokenSpan
from ._trajectory import Trajectory as Trajectory
from ._trajectory import TrajectoryImage as TrajectoryImage
from ._trajectory import TrajectoryStatus as TrajectoryStatus

__all__ = ["SpanKind", "TokenSpan", "Trajectory", "TrajectoryImage", "TrajectoryStatus"]
