"""Synthetic tasks for the demo's ``python`` tool: questions answered by a short program.

A :class:`CodeTask` is a question, the program the assistant sends to the sandbox and the
text the sandbox tool returns for it, built by the formatter :class:`SandboxTool` itself
uses (a test compares with ``toolrollout sandbox serve``). The program is the split key: a
held-out program (:func:`is_heldout_code`, ~10% by a stable hash) is never in training.
"""

from __future__ import annotations

import random
import string
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from toolrollout.apps.demo._tasks import Split, draw_distinct, hash_heldout

__all__ = [
    "CodeTask",
    "generate_code_tasks",
    "is_heldout_code",
    "run_program",
    "sandbox_schema",
    "sandbox_text",
]

HELDOUT_PERCENT: Final = 10
"""Share of programs reserved for evaluation."""

RUN_TIMEOUT: Final = 10.0
"""``default_timeout`` of ``tool_configs/sandbox.yaml`` (shown in the tool's schema)."""
MAX_TIMEOUT: Final = 30.0
"""``max_timeout`` of ``tool_configs/sandbox.yaml``."""


def is_heldout_code(code: str) -> bool:
    """Whether a program belongs to the held-out split (stable hash, ~10%)."""
    return hash_heldout("toolrollout-demo-python", code, HELDOUT_PERCENT)


def sandbox_schema() -> dict[str, object]:
    """The ``python`` tool's schema as ``tool_configs/sandbox.yaml`` shows it to the model."""
    from toolrollout.sandbox import SandboxTool

    return SandboxTool.create(run_timeout=RUN_TIMEOUT, max_timeout=MAX_TIMEOUT).schema()


def run_program(code: str) -> str:
    """What one of the task's own programs prints, run by a separate isolated interpreter.

    A child process rather than ``exec`` here: nothing in the package evaluates code
    in-process, and a program's state cannot leak into the training script.
    """
    done = subprocess.run(
        [sys.executable, "-I", "-c", code],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"demo program failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def sandbox_text(stdout: str) -> str:
    """The tool message for a program that printed ``stdout`` and exited normally."""
    from toolrollout.sandbox import RunCodeResponse
    from toolrollout.sandbox._protocol import CommandRunResult, CommandRunStatus, RunStatus
    from toolrollout.sandbox._tool import format_run_code_response

    response = RunCodeResponse(
        status=RunStatus.Success,
        message="",
        run_result=CommandRunResult(
            status=CommandRunStatus.Finished, return_code=0, stdout=stdout, stderr=""
        ),
    )
    return format_run_code_response(response, run_timeout=RUN_TIMEOUT)


@dataclass(frozen=True, slots=True)
class CodeTask:
    """A question, the program that answers it, and the ``python`` tool's output for it."""

    question: str
    code: str
    result: str
    """The tool message text (what the sandbox tool returns)."""

    @property
    def answer(self) -> str:
        """The final answer: the program's output, as the tool returned it."""
        return self.result

    @property
    def split(self) -> Split:
        return "heldout" if is_heldout_code(self.code) else "train"


_WORDS: Final = (
    "banana", "rollout", "sandbox", "parallel", "mississippi", "gradient", "token",
    "engine", "lantern", "compass", "harbor", "window", "letter", "tomato", "cabbage",
    "reward", "policy", "sample", "bottle", "kettle", "pepper", "coffee", "balloon",
    "address", "committee", "success", "tennessee", "assessment", "papaya", "avocado",
    "river", "mirror", "puzzle", "zigzag", "python", "search", "tool", "number",
)  # fmt: skip


def _word(rng: random.Random) -> str:
    """A dictionary word, or random lowercase letters (so held-out strings are new)."""
    if rng.random() < 0.5:
        return rng.choice(_WORDS)
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(4, 9)))


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _sum_range(rng: random.Random) -> tuple[str, str]:
    a = rng.randint(0, 60)
    b = rng.randint(a + 5, rng.choice((100, 1000, 5000)))
    question = rng.choice(
        (
            "What is the sum of the integers from {a} to {b}?",
            "Add up all whole numbers from {a} to {b}.",
            "Sum every integer between {a} and {b}, inclusive.",
        )
    )
    return question.format(a=a, b=b), f"print(sum(range({a}, {b} + 1)))"


def _factorial(rng: random.Random) -> tuple[str, str]:
    n = rng.randint(3, 20)
    question = rng.choice(("What is {n} factorial?", "What is the factorial of {n}?"))
    return question.format(n=n), f"import math\nprint(math.factorial({n}))"


def _power(rng: random.Random) -> tuple[str, str]:
    a = rng.randint(2, 30)
    b = rng.randint(2, 40)
    while a**b >= 10**15:
        b -= 1
    question = rng.choice(
        (
            "What is {a} to the power of {b}?",
            "Compute {a} raised to the power {b}.",
            "What is {a}**{b}?",
        )
    )
    return question.format(a=a, b=b), f"print({a} ** {b})"


def _gcd(rng: random.Random) -> tuple[str, str]:
    k = rng.randint(2, 40)
    a, b = k * rng.randint(2, 300), k * rng.randint(2, 300)
    question = rng.choice(
        (
            "What is the greatest common divisor of {a} and {b}?",
            "Find the GCD of {a} and {b}.",
        )
    )
    return question.format(a=a, b=b), f"import math\nprint(math.gcd({a}, {b}))"


def _count_letter(rng: random.Random) -> tuple[str, str]:
    word = _word(rng)
    letter = rng.choice(word) if rng.random() < 0.8 else rng.choice(string.ascii_lowercase)
    question = rng.choice(
        (
            "How many times does the letter '{c}' appear in '{w}'?",
            "Count the letter '{c}' in the word '{w}'.",
        )
    )
    return question.format(c=letter, w=word), f"print('{word}'.count('{letter}'))"


def _reverse(rng: random.Random) -> tuple[str, str]:
    word = _word(rng)
    question = rng.choice(("Reverse the string '{w}'.", "What is '{w}' spelled backwards?"))
    return question.format(w=word), f"print('{word}'[::-1])"


def _length(rng: random.Random) -> tuple[str, str]:
    text = " ".join(_word(rng) for _ in range(rng.randint(1, 3)))
    question = rng.choice(
        ("How many characters are in '{s}'?", "What is the length of the string '{s}'?")
    )
    return question.format(s=text), f"print(len('{text}'))"


def _sort(rng: random.Random) -> tuple[str, str]:
    numbers = [rng.randint(0, rng.choice((20, 100, 1000))) for _ in range(rng.randint(3, 6))]
    shown = ", ".join(map(str, numbers))
    question = rng.choice(
        (
            "Sort these numbers in ascending order: {s}.",
            "Put {s} in increasing order.",
        )
    )
    return question.format(s=shown), f"print(sorted([{shown}]))"


def _primes(rng: random.Random) -> tuple[str, str]:
    n = rng.randint(10, 600)
    question = rng.choice(
        ("How many prime numbers are there below {n}?", "Count the primes smaller than {n}.")
    )
    code = f"print(sum(all(k % d for d in range(2, k)) for k in range(2, {n})))"
    return question.format(n=n), code


def _fibonacci(rng: random.Random) -> tuple[str, str]:
    n = rng.randint(5, 70)
    question = rng.choice(("What is the {o} Fibonacci number?", "Compute Fibonacci number {n}."))
    code = f"a, b = 0, 1\nfor _ in range({n}):\n    a, b = b, a + b\nprint(a)"
    return question.format(o=_ordinal(n), n=n), code


def _digit_sum(rng: random.Random) -> tuple[str, str]:
    n = rng.randint(100, 10 ** rng.randint(4, 12))
    question = rng.choice(("What is the sum of the digits of {n}?", "Add up the digits of {n}."))
    return question.format(n=n), f"print(sum(int(d) for d in str({n})))"


def _squares(rng: random.Random) -> tuple[str, str]:
    n = rng.randint(3, 500)
    question = rng.choice(
        (
            "What is the sum of the squares of the integers from 1 to {n}?",
            "Add up k*k for every k from 1 to {n}.",
        )
    )
    return question.format(n=n), f"print(sum(k * k for k in range(1, {n} + 1)))"


def _modulo(rng: random.Random) -> tuple[str, str]:
    a = rng.randint(100, 10 ** rng.randint(3, 9))
    b = rng.randint(2, 997)
    question = rng.choice(
        ("What is the remainder when {a} is divided by {b}?", "What is {a} mod {b}?")
    )
    return question.format(a=a, b=b), f"print({a} % {b})"


_GENERATORS: Final[tuple[Callable[[random.Random], tuple[str, str]], ...]] = (
    _sum_range,
    _factorial,
    _power,
    _gcd,
    _count_letter,
    _reverse,
    _length,
    _sort,
    _primes,
    _fibonacci,
    _digit_sum,
    _squares,
    _modulo,
)


def generate_code_tasks(n: int, *, seed: int, split: Split) -> list[CodeTask]:
    """``n`` tasks of the given split with distinct questions, deterministic in ``seed``.

    Programs are run once each (memoised), so a repeated program costs nothing.
    """
    rng = random.Random(seed)

    def draw() -> tuple[str, str] | None:
        question, code = rng.choice(_GENERATORS)(rng)
        return None if is_heldout_code(code) != (split == "heldout") else (question, code)

    drawn = draw_distinct(n, draw, lambda task: task[0], f"{split} python tasks")
    outputs = {code: sandbox_text(run_program(code)) for code in {c for _, c in drawn}}
    return [CodeTask(question, code, outputs[code]) for question, code in drawn]
