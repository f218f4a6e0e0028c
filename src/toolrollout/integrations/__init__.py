"""Trainer adapters: TRL's ``rollout_func``, a verl agent loop, an ms-swift scheduler.

Light names import nothing from the trainers; ``ToolRolloutAgentLoop`` (verl) and
``ToolRolloutWeightSync`` (ms-swift) are loaded on first access. ms-swift's scheduler is
registered by the plugin file ``SWIFT_PLUGIN_PATH``.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Final

from ._metrics import trajectory_extras as trajectory_extras
from ._trl import TRLRolloutFunc as TRLRolloutFunc
from ._trl import trl_rollout_func as trl_rollout_func
from ._verl_batch import to_verl_batch as to_verl_batch
from ._verl_engine import VerlServerEngine as VerlServerEngine

__all__ = [
    "SWIFT_PLUGIN_PATH",
    "TRLRolloutFunc",
    "ToolRolloutAgentLoop",
    "ToolRolloutWeightSync",
    "VerlServerEngine",
    "to_verl_batch",
    "trajectory_extras",
    "trl_rollout_func",
]

SWIFT_PLUGIN_PATH: Final[Path] = Path(__file__).resolve().parent / "plugins" / "swift_plugin.py"
"""The file to pass to ms-swift's ``--external_plugins``."""

_LAZY = {
    "ToolRolloutAgentLoop": "._verl_loop",
    "ToolRolloutWeightSync": "._swift_sync",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
