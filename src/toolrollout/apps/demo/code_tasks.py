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


_Drawn = tuple[str, tuple[str, ...]]
"""A program and the wordings of its question (one is chosen)."""


def _word(rng: random.Random) -> str:
    """A dictionary word, or random lowercase letters (so held-out strings are new)."""
    if rng.random() < 0.5:
        return rng.choice(_WORDS)
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(4, 9)))


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _sum_range(rng: random.Random) -> _Drawn:
    a = rng.randint(0, 60)
    b = rng.randint(a + 5, rng.choice((100, 1000, 5000)))
    return f"print(sum(range({a}, {b} + 1)))", (
        f"What is the sum of the integers from {a} to {b}?",
        f"Add up all whole numbers from {a} to {b}.",
        f"Sum every integer between {a} and {b}, inclusive.",
    )


def _factorial(rng: random.Random) -> _Drawn:
    n = rng.randint(3, 20)
    code = f"import math\nprint(math.factorial({n}))"
    return code, (f"What is {n} factorial?", f"What is the factorial of {n}?")


def _power(rng: random.Random) -> _Drawn:
    a = rng.randint(2, 30)
    b = rng.randint(2, 40)
    while a**b >= 10**15:
        b -= 1
    return f"print({a} ** {b})", (
        f"What is {a} to the power of {b}?",
        f"Compute {a} raised to the power {b}.",
        f"What is {a}**{b}?",
    )


def _gcd(rng: random.Random) -> _Drawn:
    k = rng.randint(2, 40)
    a, b = k * rng.randint(2, 300), k * rng.randint(2, 300)
    return f"import math\nprint(math.gcd({a}, {b}))", (
        f"What is the greatest common divisor of {a} and {b}?",
        f"Find the GCD of {a} and {b}.",
    )


def _count_letter(rng: random.Random) -> _Drawn:
    w = _word(rng)
    c = rng.choice(w) if rng.random() < 0.8 else rng.choice(string.ascii_lowercase)
    return f"print('{w}'.count('{c}'))", (
        f"How many times does the letter '{c}' appear in '{w}'?",
        f"Count the letter '{c}' in the word '{w}'.",
    )


def _reverse(rng: random.Random) -> _Drawn:
    w = _word(rng)
    return f"print('{w}'[::-1])", (
        f"Reverse the string '{w}'.",
        f"What is '{w}' spelled backwards?",
    )


def _length(rng: random.Random) -> _Drawn:
    s = " ".join(_word(rng) for _ in range(rng.randint(1, 3)))
    return f"print(len('{s}'))", (
        f"How many characters are in '{s}'?",
        f"What is the length of the string '{s}'?",
    )


def _sort(rng: random.Random) -> _Drawn:
    numbers = [rng.randint(0, rng.choice((20, 100, 1000))) for _ in range(rng.randint(3, 6))]
    s = ", ".join(map(str, numbers))
    return f"print(sorted([{s}]))", (
        f"Sort these numbers in ascending order: {s}.",
        f"Put {s} in increasing order.",
    )


def _primes(rng: random.Random) -> _Drawn:
    n = rng.randint(10, 600)
    return f"print(sum(all(k % d for d in range(2, k)) for k in range(2, {n})))", (
        f"How many prime numbers are there below {n}?",
        f"Count the primes smaller than {n}.",
    )


def _fibonacci(rng: random.Random) -> _Drawn:
    n = rng.randint(5, 70)
    return f"a, b = 0, 1\nfor _ in range({n}):\n    a, b = b, a + b\nprint(a)", (
        f"What is the {_ordinal(n)} Fibonacci number?",
        f"Compute Fibonacci number {n}.",
    )


def _digit_sum(rng: random.Random) -> _Drawn:
    n = rng.randint(100, 10 ** rng.randint(4, 12))
    code = f"print(sum(int(d) for d in str({n})))"
    return code, (f"What is the sum of the digits of {n}?", f"Add up the digits of {n}.")


def _squares(rng: random.Random) -> _Drawn:
    n = rng.randint(3, 500)
    return f"print(sum(k * k for k in range(1, {n} + 1)))", (
        f"What is the sum of the squares of the integers from 1 to {n}?",
        f"Add up k*k for every k from 1 to {n}.",
    )


def _modulo(rng: random.Random) -> _Drawn:
    a = rng.randint(100, 10 ** rng.randint(3, 9))
    b = rng.randint(2, 997)
    return f"print({a} % {b})", (
        f"What is the remainder when {a} is divided by {b}?",
        f"What is {a} mod {b}?",
    )


_GENERATORS: Final[tuple[Callable[[random.Random], _Drawn], ...]] = (
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
        code, wordings = rng.choice(_GENERATORS)(rng)
        question = rng.choice(wordings)
        return None if is_heldout_code(code) != (split == "heldout") else (question, code)

    drawn = draw_distinct(n, draw, lambda task: task[0], f"{split} python tasks")
    outputs = {code: sandbox_text(run_program(code)) for code in {c for _, c in drawn}}
    return [CodeTask(question, code, outputs[code]) for question, code in drawn]
