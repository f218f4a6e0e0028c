"""Every exception toolrollout raises, in one tree under :class:`ToolRolloutError`.

``except ToolRolloutError`` catches them all; the branches tell apart who is at fault (the
caller, the model, the engine, a tool backend). The tree with one line per class is drawn in
the docstring of :mod:`toolrollout._exceptions`. Only :class:`ToolRolloutError` and
:class:`UserError` are also exported at the top level.
"""

from toolrollout._exceptions import BenchmarkError as BenchmarkError
from toolrollout._exceptions import CircuitOpen as CircuitOpen
from toolrollout._exceptions import ConfigError as ConfigError
from toolrollout._exceptions import DistributedError as DistributedError
from toolrollout._exceptions import EngineConnectionError as EngineConnectionError
from toolrollout._exceptions import EngineError as EngineError
from toolrollout._exceptions import EngineHTTPError as EngineHTTPError
from toolrollout._exceptions import EngineRequestRejected as EngineRequestRejected
from toolrollout._exceptions import EngineTimeout as EngineTimeout
from toolrollout._exceptions import EngineUnavailable as EngineUnavailable
from toolrollout._exceptions import ImageError as ImageError
from toolrollout._exceptions import InexactLogprobsError as InexactLogprobsError
from toolrollout._exceptions import InteractionError as InteractionError
from toolrollout._exceptions import MissingExtraError as MissingExtraError
from toolrollout._exceptions import ModelBehaviorError as ModelBehaviorError
from toolrollout._exceptions import OverlongPromptError as OverlongPromptError
from toolrollout._exceptions import SandboxIsolationError as SandboxIsolationError
from toolrollout._exceptions import TokenizationError as TokenizationError
from toolrollout._exceptions import ToolArgumentError as ToolArgumentError
from toolrollout._exceptions import ToolError as ToolError
from toolrollout._exceptions import ToolExecutionError as ToolExecutionError
from toolrollout._exceptions import ToolNotFound as ToolNotFound
from toolrollout._exceptions import ToolParseError as ToolParseError
from toolrollout._exceptions import ToolRolloutError as ToolRolloutError
from toolrollout._exceptions import ToolTimeout as ToolTimeout
from toolrollout._exceptions import ToolUnavailable as ToolUnavailable
from toolrollout._exceptions import TrackingError as TrackingError
from toolrollout._exceptions import UserError as UserError

__all__ = [
    "BenchmarkError",
    "CircuitOpen",
    "ConfigError",
    "DistributedError",
    "EngineConnectionError",
    "EngineError",
    "EngineHTTPError",
    "EngineRequestRejected",
    "EngineTimeout",
    "EngineUnavailable",
    "ImageError",
    "InexactLogprobsError",
    "InteractionError",
    "MissingExtraError",
    "ModelBehaviorError",
    "OverlongPromptError",
    "SandboxIsolationError",
    "TokenizationError",
    "ToolArgumentError",
    "ToolError",
    "ToolExecutionError",
    "ToolNotFound",
    "ToolParseError",
    "ToolRolloutError",
    "ToolTimeout",
    "ToolUnavailable",
    "TrackingError",
    "UserError",
]
