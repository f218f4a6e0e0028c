"""Multi-turn tool rollouts: the run loop, its budgets, trajectories and their output files.

Images from tools are kept on the trajectory with their token spans; ``verl_multi_modal_data``,
``trl_messages`` and ``swift_row`` hand them to trainers. The output files need pyarrow (the
``parquet`` extra), loaded on first access so ``import toolrollout`` does not import it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from toolrollout._pacing import pacing_statistics as pacing_statistics
from toolrollout._pacing import set_pacing as set_pacing
from toolrollout._records import ResumePoint as ResumePoint
from toolrollout._records import RolloutPrompt as RolloutPrompt
from toolrollout._records import TokenSpan as TokenSpan
from toolrollout._records import Trajectory as Trajectory
from toolrollout._records import TrajectoryImage as TrajectoryImage
from toolrollout._records import TrajectoryStatus as TrajectoryStatus

from ._config import RolloutConfig as RolloutConfig
from ._hooks import TrajectoryHooks as TrajectoryHooks
from ._images import swift_row as swift_row
from ._images import trl_messages as trl_messages
from ._images import verl_multi_modal_data as verl_multi_modal_data
from ._runner import RolloutRunner as RolloutRunner
from ._state import TrajectoryState as TrajectoryState
from ._types import EnvStep as EnvStep

if TYPE_CHECKING:
    from ._leftover import read_leftover as read_leftover
    from ._leftover import write_leftover as write_leftover
    from ._output import RUN_METADATA_KEY as RUN_METADATA_KEY
    from ._output import TRAJECTORY_SCHEMA as TRAJECTORY_SCHEMA
    from ._output import TrajectoryWriter as TrajectoryWriter
    from ._output import read_rows as read_rows
    from ._output import read_run_metadata as read_run_metadata
    from ._output import write_trajectories as write_trajectories
    from ._shards import ShardWriter as ShardWriter
    from ._shards import clean_finished as clean_finished
    from ._shards import compact_shards as compact_shards
    from ._shards import done_samples as done_samples
    from ._shards import finish_shards as finish_shards
    from ._shards import finished_mark as finished_mark
    from ._shards import read_shards as read_shards

__all__ = [
    "RUN_METADATA_KEY",
    "TRAJECTORY_SCHEMA",
    "EnvStep",
    "ResumePoint",
    "RolloutConfig",
    "RolloutPrompt",
    "RolloutRunner",
    "ShardWriter",
    "TokenSpan",
    "Trajectory",
    "TrajectoryHooks",
    "TrajectoryImage",
    "TrajectoryState",
    "TrajectoryStatus",
    "TrajectoryWriter",
    "clean_finished",
    "compact_shards",
    "done_samples",
    "finish_shards",
    "finished_mark",
    "pacing_statistics",
    "read_leftover",
    "read_rows",
    "read_run_metadata",
    "read_shards",
    "set_pacing",
    "swift_row",
    "trl_messages",
    "verl_multi_modal_data",
    "write_leftover",
    "write_trajectories",
]

_LAZY_MODULES = ("._output", "._shards", "._leftover")
"""Where the names of ``__all__`` not imported above are (they need pyarrow)."""


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from toolrollout._extras import require_extra

    require_extra("parquet", f"toolrollout.rollout.{name}")
    for module in _LAZY_MODULES:
        value = getattr(importlib.import_module(module, __name__), name, None)
        if value is not None:
            globals()[name] = value
            return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
