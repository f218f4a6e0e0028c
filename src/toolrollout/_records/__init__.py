"""The records every layer shares: prompts, trajectories, their token spans, statuses,
images and resume points. A leaf (it imports nothing of toolrollout), re-exported by
:mod:`toolrollout.rollout`.
"""

from ._resume import RESUME_FORMAT_VERSION as RESUME_FORMAT_VERSION
from ._resume import ResumeFormatError as ResumeFormatError
from ._resume import ResumePoint as ResumePoint
from ._trajectory import RolloutPrompt as RolloutPrompt
from ._trajectory import SpanKind as SpanKind
from ._trajectory import TokenSpan as TokenSpan
from ._trajectory import Trajectory as Trajectory
from ._trajectory import TrajectoryImage as TrajectoryImage
from ._trajectory import TrajectoryStatus as TrajectoryStatus

__all__ = [
    "RESUME_FORMAT_VERSION",
    "ResumeFormatError",
    "ResumePoint",
    "RolloutPrompt",
    "SpanKind",
    "TokenSpan",
    "Trajectory",
    "TrajectoryImage",
    "TrajectoryStatus",
]
