"""The safe calculator (toolrollout.tools.calculator): right answers, clear errors, no code run."""

from __future__ import annotations

import pytest

from toolrollout.tools.calculator import CALCULATOR_TOOL, CalculatorError, calculator, evaluate


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("37 * 12", "444"),
        ("81 - 9", "72"),
        ("9 - 81", "-72"),
        ("(4 + 5) * 3", "27"),
        ("4 + 5 * 3", "19"),
        ("84 / 7", "12"),
        ("7 / 2", "3.5"),
        ("1 / 3", "0.333333333333"),
        ("17 // 5", "3"),
        ("-17 // 5", "-4"),
        ("17 % 5", "2"),
        ("2 ** 10", "1024"),
        ("2 ** -1", "0.5"),
        ("-3", "-3"),
        ("+3", "3"),
        ("--3", "3"),
        ("((((1))))", "1"),
        ("  12 +   30 ", "42"),
        ("1.5 * 4", "6"),
        ("0.1 + 0.2", "0.3"),
        ("123456789 * 987654321", "121932631112635269"),
    ],
)
def test_results(expression: str, expected: str) -> None:
    assert calculator(expression) == expected


def test_evaluate_returns_numbers() -> None:
    assert evaluate("6 * 7") == 42
    assert isinstance(evaluate("6 * 7"), int)
    assert evaluate("7 / 2") == 3.5


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("x + 1", "names are not allowed"),
        ("__import__('os').system('echo hi')", "function calls are not allowed"),
        ("abs(-3)", "function calls are not allowed"),
        ("(1).real", "attribute access is not allowed"),
        ("().__class__", "attribute access is not allowed"),
        ("2 ** 100000", "exponent 100000 is too large"),
        ("10 ** 10 ** 10", "exponent 10000000000 is too large"),
        ("9 ** 64 ** 2", "too large"),
        ("10 ** 31", "result is too large"),
        ("1 / 0", "division by zero"),
        ("1 // 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("(-8) ** 0.5", "not a real number"),
        ("1 +", "invalid syntax"),
        ("", "expression is empty"),
        ("1 + 1" * 100, "longer than"),
        ("'a' * 3", "unsupported constant"),
        ("True + 1", "unsupported constant"),
        ("[1, 2]", "unsupported syntax List"),
        ("1 if 1 else 2", "unsupported syntax IfExp"),
        ("lambda: 1", "unsupported syntax Lambda"),
        ("1 < 2", "unsupported syntax Compare"),
        ("1 << 5", "unsupported operator LShift"),
        ("~1", "unsupported operator Invert"),
        ("1; 2", "invalid syntax"),
        ("import os", "invalid syntax"),
        ("-(" * 40 + "1" + ")" * 40, "nested too deeply"),
    ],
)
def test_rejects_with_clear_error(expression: str, reason: str) -> None:
    result = calculator(expression)
    assert result.startswith("Error: "), result
    assert reason in result
    with pytest.raises(CalculatorError):
        evaluate(expression)


def test_never_evaluates_code(monkeypatch: pytest.MonkeyPatch) -> None:
    # ``ast.parse`` only builds a syntax tree; eval/exec must never be reached.
    calls: list[str] = []

    def spy(*args: object, **kwargs: object) -> None:
        calls.append("called")

    import builtins

    monkeypatch.setattr(builtins, "eval", spy)
    monkeypatch.setattr(builtins, "exec", spy)
    assert calculator("2 * 21") == "42"
    assert calculator("__import__('os').getcwd()").startswith("Error: ")
    assert calls == []


def test_non_string_input() -> None:
    assert calculator(42).startswith("Error: ")  # type: ignore[arg-type]


def test_tool_schema() -> None:
    assert CALCULATOR_TOOL["type"] == "function"
    function = CALCULATOR_TOOL["function"]
    assert function["name"] == "calculator"
    assert function["description"]
    parameters = function["parameters"]
    assert parameters["type"] == "object"
    assert parameters["properties"]["expression"]["type"] == "string"
    assert parameters["required"] == ["expression"]
