"""Multi-turn tool rollouts: the run loop, its budgets, trajectories and their output files."""

from ._config import RolloutConfig as RolloutConfig
from ._loop import RolloutPrompt as RolloutPrompt
from ._output import TRAJECTORY_SCHEMA as TRAJECTORY_SCHEMA
from ._output import TrajectoryWriter as TrajectoryWriter
from ._output import read_rows as read_rows
from ._output import write_trajectories as write_trajectories
from ._runner import RolloutRunner as RolloutRunner
from ._runner import as_prompt as as_prompt
from ._trajectory import SpanKind as SpanKind
from ._trajectory import TokenSpan as TokenSpan
from ._trajectory import Trajectory as Trajectory
from ._trajectory import TrajectoryStatus as TrajectoryStatus

__all__ = [
    "TRAJECTORY_SCHEMA",
    "RolloutConfig",
    "RolloutPrompt",
    "RolloutRunner",
    "SpanKind",
    "TokenSpan",
    "Trajectory",
    "TrajectoryStatus",
    "TrajectoryWriter",
    "as_prompt",
    "read_rows",
    "write_trajectories",
]
