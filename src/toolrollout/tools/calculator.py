"""A safe arithmetic calculator: the built-in ``calculator`` tool and the demo task's one tool.

The expression is untrusted: it is parsed with :mod:`ast`, only numbers and arithmetic
operators are interpreted (never ``eval``), and exponents and magnitudes are bounded.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any, Final

__all__ = [
    "CALCULATOR_TOOL",
    "CalculatorError",
    "calculator",
    "evaluate",
    "format_number",
]

MAX_EXPRESSION_CHARS: Final = 200
"""Longer inputs are rejected before parsing (bounds parser time and recursion depth)."""
MAX_EXPONENT: Final = 64
"""Largest absolute exponent accepted by ``**``."""
MAX_ABS_VALUE: Final = 10**30
"""Largest magnitude of any intermediate or final value."""
MAX_DEPTH: Final = 32
"""Largest nesting depth of the expression tree."""

CALCULATOR_TOOL: Final[dict[str, Any]] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression and return the result.",
        "parameters": {
            "type": "object",
            "properties": {
                "expression": {
                    "type": "string",
                    "description": (
                        "Arithmetic with + - * / // % ** and parentheses, e.g. 3 * (4 + 5)"
                    ),
                }
            },
            "required": ["expression"],
        },
    },
}
"""OpenAI-style function schema of :func:`calculator`, as passed in ``tools=[...]``.

The demo model was trained with exactly this schema in its system prompt: editing the text
changes the prompt it sees (retrain with :mod:`toolrollout.apps.demo.train` after doing so)."""


class CalculatorError(ValueError):
    """The expression is not valid arithmetic, or is outside the calculator's bounds."""


Number = int | float

_BINARY_OPS: Final[dict[type[ast.operator], Callable[[Any, Any], Any]]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY_OPS: Final[dict[type[ast.unaryop], Callable[[Any], Any]]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def _check_magnitude(value: Number) -> Number:
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("result is not a finite number")
    if abs(value) > MAX_ABS_VALUE:
        raise CalculatorError("result is too large")
    return value


def _eval_node(node: ast.AST, depth: int) -> Number:
    if depth > MAX_DEPTH:
        raise CalculatorError("expression is nested too deeply")
    if isinstance(node, ast.Constant):
        # bool is a subclass of int, but True/False are not numbers here.
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise CalculatorError(f"unsupported constant {node.value!r}")
        return _check_magnitude(node.value)
    if isinstance(node, ast.UnaryOp):
        unary = _UNARY_OPS.get(type(node.op))
        if unary is None:
            raise CalculatorError(f"unsupported operator {type(node.op).__name__}")
        return _check_magnitude(unary(_eval_node(node.operand, depth + 1)))
    if isinstance(node, ast.BinOp):
        binary = _BINARY_OPS.get(type(node.op))
        if binary is None:
            raise CalculatorError(f"unsupported operator {type(node.op).__name__}")
        left = _eval_node(node.left, depth + 1)
        right = _eval_node(node.right, depth + 1)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CalculatorError(f"exponent {format_number(right)} is too large")
        try:
            result = binary(left, right)
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        except OverflowError:
            raise CalculatorError("result is too large") from None
        if isinstance(result, complex):
            raise CalculatorError("result is not a real number")
        return _check_magnitude(result)
    if isinstance(node, ast.Name):
        raise CalculatorError(f"names are not allowed (got {node.id!r})")
    if isinstance(node, ast.Call):
        raise CalculatorError("function calls are not allowed")
    if isinstance(node, ast.Attribute):
        raise CalculatorError("attribute access is not allowed")
    raise CalculatorError(f"unsupported syntax {type(node).__name__}")


def evaluate(expression: str) -> Number:
    """Evaluate ``expression`` and return the number; raise :class:`CalculatorError` if invalid.

    Used directly by code (reward functions, tests) that wants the value, not the string.
    """
    if not isinstance(expression, str):
        raise CalculatorError("expression must be a string")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression is longer than {MAX_EXPRESSION_CHARS} characters")
    if not expression.strip():
        raise CalculatorError("expression is empty")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise CalculatorError("invalid syntax") from None
    return _eval_node(tree.body, 0)


def format_number(value: Number) -> str:
    """A result as the tool reports it (``84 / 7`` gives ``"12"``; 12 significant digits)."""
    if isinstance(value, float):
        if value.is_integer():
            return str(int(value))
        return format(value, ".12g")
    return str(value)


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression; return the result, or ``"Error: <reason>"``."""
    try:
        return format_number(evaluate(expression))
    except CalculatorError as exc:
        return f"Error: {exc}"
