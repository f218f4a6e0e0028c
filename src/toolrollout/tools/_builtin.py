"""Built-in tools: the safe calculator (:mod:`.calculator`) and a GSM8K answer checker
(verl's ``Gsm8kTool``, whose name loads as :class:`Gsm8kTool`)."""

from __future__ import annotations

import re
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from toolrollout._exceptions import UserError

from ._base import Tool
from ._function import FunctionTool
from ._lifecycle import StatefulTool
from ._types import ToolContext, ToolLimits, ToolResult
from .calculator import CALCULATOR_TOOL, calculator

__all__ = ["CalculatorTool", "Gsm8kTool", "calculator_tool", "gsm8k_score"]


async def _calculate(expression: str) -> ToolResult:
    """Evaluate an arithmetic expression.

    Args:
        expression: Arithmetic with + - * / // % ** and parentheses.
    """
    # The calculator is bounded (length, depth, magnitude), so it runs inline, no thread.
    text = calculator(expression)
    return ToolResult(text=text, is_error=text.startswith("Error:"))


@dataclass(frozen=True, kw_only=True)
class CalculatorTool(FunctionTool[[str], Coroutine[Any, Any, ToolResult]]):
    """The demo's safe calculator as a tool, with the demo's ``CALCULATOR_TOOL`` schema; a
    bad expression yields an ``is_error`` result starting with ``Error:``."""

    @classmethod
    def create(cls, *, limits: ToolLimits | None = None) -> CalculatorTool:
        """Build the tool with the demo's schema."""
        tool = cls.from_function(_calculate, name="calculator", limits=limits)
        return tool.with_schema(CALCULATOR_TOOL)

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any], tool_schema: Mapping[str, Any] | None = None
    ) -> Tool:
        """Tool-config constructor; the calculator has no settings of its own."""
        return cls.create()


def calculator_tool(*, limits: ToolLimits | None = None) -> CalculatorTool:
    """The built-in calculator tool (see :class:`CalculatorTool`)."""
    return CalculatorTool.create(limits=limits)


_NUMBER_RE = re.compile(r"(-?[0-9.,]+)")
_CLIP_CHARS = 300


def _last_number(text: str) -> str | None:
    """The last number in ``text`` (verl's "flexible" GSM8K extraction)."""
    candidates: list[str] = _NUMBER_RE.findall(text[-_CLIP_CHARS:])
    for candidate in reversed(candidates):
        if candidate not in ("", "."):
            return candidate
    return None


def _as_decimal(text: str) -> Decimal | None:
    try:
        return Decimal(text.replace(",", "").replace("$", "").rstrip("."))
    except InvalidOperation:
        return None


def gsm8k_score(solution: str, ground_truth: object) -> float:
    """1.0 if the last number in ``solution`` equals ``ground_truth`` numerically (verl's
    flexible GSM8K scorer, but ``72.0`` equals ``72``), else 0.0."""
    answer = _last_number(solution)
    if answer is None:
        return 0.0
    got = _as_decimal(answer)
    want = _as_decimal(str(ground_truth).split("####")[-1].strip())
    return 1.0 if got is not None and want is not None and got == want else 0.0


def _gsm8k_parameters() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "answer": {
                "type": "string",
                "description": "The model's answer to the GSM8K math problem, must be a digits",
            }
        },
        "required": ["answer"],
    }


@dataclass(frozen=True, kw_only=True)
class Gsm8kTool(StatefulTool):
    """Checks a GSM8K answer against the sample's ground truth, as verl's ``Gsm8kTool``:
    a per-call reward of 0.0 when the answer improved, else -0.05."""

    name: str = "calc_gsm8k_reward"
    description: str = (
        "A tool for calculating the reward of gsm8k. (1.0 if parsed answer is correct, "
        "0.0 if parsed answer is incorrect or not correctly parsed)"
    )
    parameters: Mapping[str, Any] = field(default_factory=_gsm8k_parameters)
    _instances: dict[str, dict[str, Any]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any], tool_schema: Mapping[str, Any] | None = None
    ) -> Tool:
        """Tool-config constructor; no settings of its own."""
        return cls()

    def create_kwargs_for(self, context: ToolContext) -> dict[str, Any]:
        """The row's ``create_kwargs``; the row's ground truth when they name none."""
        kwargs = super().create_kwargs_for(context)
        if kwargs.get("ground_truth") is None and context.ground_truth is not None:
            kwargs["ground_truth"] = context.ground_truth
        return kwargs

    async def create(self, instance_id: str, **create_kwargs: Any) -> str:
        """Remember the sample's ground truth."""
        ground_truth = create_kwargs.get("ground_truth")
        if ground_truth is None:
            raise UserError(
                f"tool {self.name!r} needs the sample's ground truth: set "
                f"extra_info.tools_kwargs.{self.name}.create_kwargs.ground_truth "
                "(or the row's answer)"
            )
        self._instances[instance_id] = {"ground_truth": ground_truth, "reward": 0.0, "response": ""}
        return instance_id

    async def execute(
        self, instance_id: str, parameters: Mapping[str, Any], **execute_kwargs: Any
    ) -> ToolResult:
        """Score the answer and return verl's message, reward and metrics."""
        slot = self._instances[instance_id]
        answer = parameters.get("answer", "")
        if not isinstance(answer, str):
            answer = str(answer)
        response = answer if answer.startswith("#### ") else "#### " + answer
        reward = gsm8k_score(response, slot["ground_truth"])
        tool_reward = 0.0 if reward > slot["reward"] else -0.05
        slot["reward"] = reward
        slot["response"] = response
        return ToolResult(
            text=f"Current parsed {answer=} {reward=}",
            reward=tool_reward,
            metrics={"answer_reward": reward},
        )

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float | None:
        """The score of the last answer submitted (0.0 if none was)."""
        slot = self._instances[instance_id]
        return gsm8k_score(slot["response"], slot["ground_truth"]) if slot["response"] else 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """Forget the instance."""
        self._instances.pop(instance_id, None)
