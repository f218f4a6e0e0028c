"""The built-in reward functions on hand-built trajectories: the answer formats they accept."""

from __future__ import annotations

from typing import Any

import pytest

from toolrollout._records import Trajectory, TrajectoryStatus
from toolrollout.rewards import exact_match, numeric_match, tool_error_penalty
from toolrollout.rewards._base import final_answer_text


def answered(
    content: Any, ground_truth: Any = None, *, tool_errors: int = 0, parse_errors: int = 0
) -> Trajectory:
    """A finished trajectory whose last assistant message says ``content``."""
    return Trajectory(
        uid="g-0",
        group_id="g",
        prompt_index=0,
        sample_index=0,
        prompt_ids=(1, 2),
        spans=(),
        messages=(
            {"role": "user", "content": "question"},
            {"role": "assistant", "content": "let me think: 99"},
            {"role": "tool", "content": "77"},
            {"role": "assistant", "content": content},
        ),
        status=TrajectoryStatus.COMPLETED,
        finish_reason="stop",
        ground_truth=ground_truth,
        tool_errors=tool_errors,
        parse_errors=parse_errors,
    )


@pytest.mark.parametrize(
    ("answer", "truth"),
    [
        ("The answer is 1,234.", "1234"),  # thousands separators in the answer
        ("1234", "1,234"),  # ... and in the ground truth
        ("12.0", 12),  # a float answer for an int truth
        ("12", "12.0"),
        ("It costs 12. Done", "12"),  # a sentence's full stop is not a decimal point
        ("The total is -5", "-5"),
        ("1.5e3", "1500"),  # scientific notation
        ("2E+2 metres", 200),
        ("5e-1", "0.5"),
        ("first 3, then 4, finally 42", "42"),  # the last number counts
        ("#### 18", "18"),  # GSM8K's answer marker
        ("0.1 + 0.2 = 0.30000000000000004", "0.3"),  # within the relative tolerance
    ],
)
def test_numeric_match_accepts_equal_numbers_in_any_spelling(answer: str, truth: Any) -> None:
    assert numeric_match(answered(answer, truth)) == 1.0


@pytest.mark.parametrize(
    ("answer", "truth"),
    [
        ("5", "-5"),  # the sign matters
        ("-5", "5"),
        ("12.5", "12"),
        ("42, or maybe 41", "42"),  # only the last number counts
        ("1.5e3", "150"),
        ("no number here", "7"),
        ("", "7"),
    ],
)
def test_numeric_match_rejects_other_numbers(answer: str, truth: Any) -> None:
    assert numeric_match(answered(answer, truth)) == 0.0


def test_numeric_match_tolerance_is_relative_and_adjustable() -> None:
    near = answered("1000000.5", "1000000")
    assert numeric_match(near) == 1.0
    assert numeric_match(near, rel_tol=1e-9) == 0.0


def test_numeric_match_needs_a_numeric_ground_truth() -> None:
    with pytest.raises(ValueError, match="needs a ground truth"):
        numeric_match(answered("3"))
    with pytest.raises(ValueError, match="is not a number"):
        numeric_match(answered("3", "three"))


@pytest.mark.parametrize(
    ("answer", "truth", "score"),
    [
        ("Paris", "Paris", 1.0),
        ("  Paris\n", " Paris ", 1.0),  # surrounding whitespace on either side
        ("Paris.", "Paris", 1.0),  # a final full stop
        ("Paris...", "Paris", 1.0),
        ("paris", "Paris", 0.0),  # case matters
        ("Paris, France", "Paris", 0.0),
        ("12", 12, 1.0),  # the ground truth is compared as text
        ("12.0", 12, 0.0),  # ... so numbers are not normalised (numeric_match does that)
        ("1,234", "1234", 0.0),
        ("-5", "-5", 1.0),
        ("e.g.", "e.g.", 1.0),  # a truth ending in a full stop still matches itself
    ],
)
def test_exact_match_compares_stripped_text(answer: str, truth: Any, score: float) -> None:
    assert exact_match(answered(answer, truth)) == score


def test_exact_match_reads_the_last_assistant_message_only() -> None:
    assert exact_match(answered("77", "99")) == 0.0  # 99 was an earlier turn
    assert exact_match(answered([{"type": "text", "text": "99"}], "99")) == 0.0  # not a str
    assert final_answer_text(answered(None)) == ""
    with pytest.raises(ValueError, match="needs a ground truth"):
        exact_match(answered("x"))


def test_tool_error_penalty_counts_failed_and_malformed_calls() -> None:
    penalty = tool_error_penalty(0.25)
    assert penalty.__name__ == "tool_error_penalty"
    assert penalty(answered("x", tool_errors=2, parse_errors=1)) == pytest.approx(-0.75)
    assert penalty(answered("x")) == 0.0
    assert tool_error_penalty()(answered("x", tool_errors=1)) == pytest.approx(-0.1)
    assert tool_error_penalty(-0.5)(answered("x", parse_errors=2)) == pytest.approx(1.0)
