"""Tools: plain data plus one async ``call``, run concurrently within per-tool limits.

- :class:`Tool` is the seam; :class:`FunctionTool` / :func:`function_tool` wrap functions,
  deriving the JSON schema from type hints and the docstring.
- :class:`ToolExecutor` runs one turn's calls concurrently; every failure becomes an error
  :class:`ToolResult` that still carries the exception (nothing is swallowed).
- :class:`StatefulTool` / :class:`ToolSession`: per-trajectory instances with verl's
  ``create -> execute -> calc_reward -> release`` lifecycle.
- :func:`load_tool_config` reads verl-layout tool-config YAML; each entry's ``config.type``
  names a builder registered with :func:`register_tool_type` (the shipped ``native``,
  ``mcp``, ``sandbox`` and ``search`` types are imported on first use).
- :func:`open_tools` opens what the tools need while a run uses them (their
  :meth:`Tool.services`: MCP sessions, a local sandbox or retriever), once each.
"""

from __future__ import annotations

from ._base import Tool as Tool
from ._base import ToolService as ToolService
from ._builtin import CalculatorTool as CalculatorTool
from ._builtin import Gsm8kTool as Gsm8kTool
from ._builtin import calculator_tool as calculator_tool
from ._config import load_tool_config as load_tool_config
from ._executor import ToolExecutor as ToolExecutor
from ._function import FunctionTool as FunctionTool
from ._function import function_tool as function_tool
from ._lifecycle import StatefulTool as StatefulTool
from ._lifecycle import ToolSession as ToolSession
from ._lifecycle import tool_kwargs as tool_kwargs
from ._models import ToolEntryModel as ToolEntryModel
from ._registry import BuildContext as BuildContext
from ._registry import register_tool_type as register_tool_type
from ._registry import tool_types as tool_types
from ._services import open_tools as open_tools
from ._services import share_tools as share_tools
from ._summary import summarize_tool_calls as summarize_tool_calls
from ._types import CircuitBreakerPolicy as CircuitBreakerPolicy
from ._types import RetryPolicy as RetryPolicy
from ._types import ToolCallRequest as ToolCallRequest
from ._types import ToolContext as ToolContext
from ._types import ToolLimits as ToolLimits
from ._types import ToolResult as ToolResult
from ._verl import VerlToolAdapter as VerlToolAdapter

__all__ = [
    "BuildContext",
    "CalculatorTool",
    "CircuitBreakerPolicy",
    "FunctionTool",
    "Gsm8kTool",
    "RetryPolicy",
    "StatefulTool",
    "Tool",
    "ToolCallRequest",
    "ToolContext",
    "ToolEntryModel",
    "ToolExecutor",
    "ToolLimits",
    "ToolResult",
    "ToolService",
    "ToolSession",
    "VerlToolAdapter",
    "calculator_tool",
    "function_tool",
    "load_tool_config",
    "open_tools",
    "register_tool_type",
    "share_tools",
    "summarize_tool_calls",
    "tool_kwargs",
    "tool_types",
]
