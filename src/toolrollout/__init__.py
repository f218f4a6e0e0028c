"""toolrollout: async multi-turn tool-calling rollouts for LLM RL against SGLang.

The public surface is re-exported here; submodules (``engines``, ``chat``, ``tools``,
``rollout``, ``rewards``, ``server``, ``testing``) hold the rest. Nothing is configured at
import time (no logging handlers, no torch import).
"""

from ._exceptions import ConfigError as ConfigError
from ._exceptions import EngineConnectionError as EngineConnectionError
from ._exceptions import EngineError as EngineError
from ._exceptions import EngineHTTPError as EngineHTTPError
from ._exceptions import EngineRequestRejected as EngineRequestRejected
from ._exceptions import EngineTimeout as EngineTimeout
from ._exceptions import EngineUnavailable as EngineUnavailable
from ._exceptions import ImageError as ImageError
from ._exceptions import InteractionError as InteractionError
from ._exceptions import ModelBehaviorError as ModelBehaviorError
from ._exceptions import OverlongPromptError as OverlongPromptError
from ._exceptions import SandboxIsolationError as SandboxIsolationError
from ._exceptions import TokenizationError as TokenizationError
from ._exceptions import ToolArgumentError as ToolArgumentError
from ._exceptions import ToolError as ToolError
from ._exceptions import ToolExecutionError as ToolExecutionError
from ._exceptions import ToolNotFound as ToolNotFound
from ._exceptions import ToolParseError as ToolParseError
from ._exceptions import ToolRolloutError as ToolRolloutError
from ._exceptions import ToolTimeout as ToolTimeout
from ._exceptions import ToolUnavailable as ToolUnavailable
from ._exceptions import TrackingError as TrackingError
from ._exceptions import UserError as UserError
from ._version import __version__ as __version__
from .chat import ChatFormat as ChatFormat
from .chat import check_drift as check_drift
from .chat import get_tool_parser as get_tool_parser
from .engines import Engine as Engine
from .engines import FinishReason as FinishReason
from .engines import GenerateRequest as GenerateRequest
from .engines import GenerateResult as GenerateResult
from .engines import SamplingParams as SamplingParams
from .engines import SGLangClient as SGLangClient
from .rewards import exact_match as exact_match
from .rewards import numeric_match as numeric_match
from .rewards import tool_error_penalty as tool_error_penalty
from .rollout import RolloutBatch as RolloutBatch
from .rollout import RolloutConfig as RolloutConfig
from .rollout import RolloutPrompt as RolloutPrompt
from .rollout import RolloutRunner as RolloutRunner
from .rollout import TokenSpan as TokenSpan
from .rollout import Trajectory as Trajectory
from .rollout import TrajectoryStatus as TrajectoryStatus
from .rollout import TrajectoryWriter as TrajectoryWriter
from .rollout import read_rows as read_rows
from .rollout import write_trajectories as write_trajectories
from .tools import FunctionTool as FunctionTool
from .tools import Tool as Tool
from .tools import ToolContext as ToolContext
from .tools import ToolExecutor as ToolExecutor
from .tools import ToolLimits as ToolLimits
from .tools import ToolResult as ToolResult
from .tools import calculator_tool as calculator_tool
from .tools import function_tool as function_tool
from .tools import load_tool_config as load_tool_config

__all__ = [
    "ChatFormat",
    "ConfigError",
    "Engine",
    "EngineConnectionError",
    "EngineError",
    "EngineHTTPError",
    "EngineRequestRejected",
    "EngineTimeout",
    "EngineUnavailable",
    "FinishReason",
    "FunctionTool",
    "GenerateRequest",
    "GenerateResult",
    "ImageError",
    "InteractionError",
    "ModelBehaviorError",
    "OverlongPromptError",
    "RolloutBatch",
    "RolloutConfig",
    "RolloutPrompt",
    "RolloutRunner",
    "SGLangClient",
    "SamplingParams",
    "SandboxIsolationError",
    "TokenSpan",
    "TokenizationError",
    "Tool",
    "ToolArgumentError",
    "ToolContext",
    "ToolError",
    "ToolExecutionError",
    "ToolExecutor",
    "ToolLimits",
    "ToolNotFound",
    "ToolParseError",
    "ToolResult",
    "ToolRolloutError",
    "ToolTimeout",
    "ToolUnavailable",
    "TrackingError",
    "Trajectory",
    "TrajectoryStatus",
    "TrajectoryWriter",
    "UserError",
    "__version__",
    "calculator_tool",
    "check_drift",
    "exact_match",
    "function_tool",
    "get_tool_parser",
    "load_tool_config",
    "numeric_match",
    "read_rows",
    "tool_error_penalty",
    "write_trajectories",
]
