"""toolrollout: async multi-turn tool-calling rollouts for LLM RL against SGLang.

The top level holds what a trainer author uses: the runner and its config, the trajectory
records, the engine seam, tools, the stock rewards and the composition root
(``RunSpec``, ``open_run``, ``build_runner``). Submodules hold the rest:
``toolrollout.exceptions`` (the whole error tree), ``engines``, ``chat``, ``tools``,
``rollout``, ``rewards``, ``testing``. Applications (``server``, ``sandbox``, ``search``,
``bench``, ``eval``, ``distributed``, the demos) are never imported from here.

``import toolrollout`` imports no torch, transformers, pyarrow, FastAPI or bm25s, and
configures nothing (no logging handlers). The output-file names (``TrajectoryWriter``,
``read_rows``, ``write_trajectories``) load pyarrow on first access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._exceptions import ToolRolloutError as ToolRolloutError
from ._exceptions import UserError as UserError
from ._version import __version__ as __version__
from .chat import ChatFormat as ChatFormat
from .engines import Engine as Engine
from .engines import EngineInfo as EngineInfo
from .engines import RetryPolicy as RetryPolicy
from .engines import SamplingParams as SamplingParams
from .engines import SGLangClient as SGLangClient
from .rewards import RewardFunction as RewardFunction
from .rewards import RewardMix as RewardMix
from .rewards import exact_match as exact_match
from .rewards import numeric_match as numeric_match
from .rewards import tool_error_penalty as tool_error_penalty
from .rollout import RolloutConfig as RolloutConfig
from .rollout import RolloutPrompt as RolloutPrompt
from .rollout import RolloutRunner as RolloutRunner
from .rollout import TokenSpan as TokenSpan
from .rollout import Trajectory as Trajectory
from .rollout import TrajectoryHooks as TrajectoryHooks
from .rollout import TrajectoryStatus as TrajectoryStatus
from .rollout._batch import RolloutBatch as RolloutBatch
from .spec import RunSpec as RunSpec
from .spec import build_runner as build_runner
from .spec import open_run as open_run
from .tools import FunctionTool as FunctionTool
from .tools import StatefulTool as StatefulTool
from .tools import Tool as Tool
from .tools import ToolContext as ToolContext
from .tools import ToolLimits as ToolLimits
from .tools import ToolResult as ToolResult
from .tools import function_tool as function_tool
from .tools import load_tool_config as load_tool_config
from .tools import open_tools as open_tools

if TYPE_CHECKING:
    from .rollout import TrajectoryWriter as TrajectoryWriter
    from .rollout import read_rows as read_rows
    from .rollout import write_trajectories as write_trajectories

__all__ = [
    "ChatFormat",
    "Engine",
    "EngineInfo",
    "FunctionTool",
    "RetryPolicy",
    "RewardFunction",
    "RewardMix",
    "RolloutBatch",
    "RolloutConfig",
    "RolloutPrompt",
    "RolloutRunner",
    "RunSpec",
    "SGLangClient",
    "SamplingParams",
    "StatefulTool",
    "TokenSpan",
    "Tool",
    "ToolContext",
    "ToolLimits",
    "ToolResult",
    "ToolRolloutError",
    "Trajectory",
    "TrajectoryHooks",
    "TrajectoryStatus",
    "TrajectoryWriter",
    "UserError",
    "__version__",
    "build_runner",
    "exact_match",
    "function_tool",
    "load_tool_config",
    "numeric_match",
    "open_run",
    "open_tools",
    "read_rows",
    "tool_error_penalty",
    "write_trajectories",
]

_LAZY = frozenset({"TrajectoryWriter", "read_rows", "write_trajectories"})


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import rollout

    value = getattr(rollout, name)
    globals()[name] = value
    return value
