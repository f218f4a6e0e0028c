"""Synthetic tasks for the demo's ``calculator`` tool: arithmetic questions.

A :class:`Problem` is a question with the calculator expression(s) that answer it, in one
of three shapes: ``single`` (one call), ``chain`` (a second call on the first result) and
``parallel`` (two independent calls in one assistant turn). Held-out problems are chosen
by hashing each canonical expression (:func:`is_heldout`): a training problem never
contains a held-out expression, so the shipped prompts were never seen in training.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from toolrollout.apps.demo._tasks import Split, draw_distinct, hash_heldout
from toolrollout.tools.calculator import calculator

__all__ = [
    "EVAL_MIX",
    "HELDOUT_PERCENT",
    "TRAIN_MIX",
    "Problem",
    "generate_problems",
    "is_heldout",
    "operand",
]

Kind = Literal["single", "chain", "parallel"]

HELDOUT_PERCENT: Final = 10
"""Share of canonical expressions reserved for evaluation."""


def is_heldout(expression: str) -> bool:
    """Whether a canonical expression belongs to the held-out split (stable hash, ~10%)."""
    return hash_heldout("toolrollout-demo", expression, HELDOUT_PERCENT)


@dataclass(frozen=True, slots=True)
class Problem:
    """A question, the calculator calls that solve it (in order) and their real results."""

    kind: Kind
    question: str
    calls: tuple[str, ...]
    """The expressions the assistant passes to ``calculator``, one per call."""
    results: tuple[str, ...]
    """The calculator's real output for each call."""
    split_keys: tuple[str, ...]
    """The canonical expressions that decide the split (a chain's second step is keyed
    with its first result replaced by ``R``)."""

    @classmethod
    def make(cls, kind: Kind, question: str, expressions: Sequence[str]) -> Problem:
        """Build a problem; in a ``chain`` the second expression holds ``{r}``, the first result."""
        calls: list[str] = []
        results: list[str] = []
        for expression in expressions:
            call = expression.format(r=results[-1]) if results else expression
            calls.append(call)
            results.append(calculator(call))
        keys = tuple(e.format(r="R") if "{r}" in e else e for e in expressions)
        return cls(kind, question, tuple(calls), tuple(results), keys)

    @property
    def answer(self) -> str:
        """The result the final assistant turn must state."""
        return self.results[-1]

    @property
    def split(self) -> Split:
        """``heldout`` if any of its canonical expressions is held out."""
        return "heldout" if any(is_heldout(k) for k in self.split_keys) else "train"


# ---------------------------------------------------------------------------------------
# Numbers and questions

_OP_WORDS: Final[dict[str, tuple[str, ...]]] = {
    "+": ("plus",),
    "-": ("minus",),
    "*": ("times", "multiplied by"),
    "/": ("divided by", "over"),
}

_SYMBOLIC: Final = (
    "What is {e}?",
    "What's {e}?",
    "Calculate {e}.",
    "Calculate {e}",
    "Compute {e}.",
    "Please evaluate {e}.",
    "{e} = ?",
    "How much is {e}?",
    "Can you work out {e} for me?",
    "Use the calculator to find {e}.",
    "what is {e}",
    "Solve {e}.",
)
_WORDED: Final = (
    "What is {a} {w} {b}?",
    "How much is {a} {w} {b}?",
    "Compute {a} {w} {b}.",
    "Tell me {a} {w} {b}.",
    "What do you get for {a} {w} {b}?",
    "Quick question: {a} {w} {b}?",
)
_SEMANTIC: Final[dict[str, tuple[str, ...]]] = {
    # Operands are always mentioned in expression order: the model copies, never reorders.
    "+": (
        "What is the sum of {a} and {b}?",
        "Add {a} and {b}.",
        "Find the total of {a} and {b}.",
    ),
    "-": (
        "What is the difference between {a} and {b}?",
        "From {a}, subtract {b}.",
        "Start with {a} and take away {b}.",
    ),
    "*": (
        "What is the product of {a} and {b}?",
        "Multiply {a} by {b}.",
        "Find the product of {a} and {b}.",
    ),
    "/": (
        "Divide {a} by {b}.",
        "What is the quotient of {a} and {b}?",
    ),
}
_CHAIN_STEPS: Final[dict[str, tuple[str, ...]]] = {
    "+": ("then add {c} to the result", "then add {c}", "and add {c} to that"),
    "-": ("then subtract {c} from the result", "then subtract {c}", "and take away {c}"),
    "*": ("then multiply the result by {c}", "then multiply by {c}", "and double it"),
}
_CHAIN_FRAMES: Final = (
    "Compute {e}, {step}.",
    "First calculate {e}, {step}.",
    "Work out {e} and {step}.",
    "Take {e}, {step}. What do you get?",
)
_PARALLEL_FRAMES: Final = (
    "What are {e1} and {e2}?",
    "Compute both {e1} and {e2}.",
    "Calculate {e1} and also {e2}.",
    "I need two results: {e1} and {e2}.",
)


def operand(rng: random.Random) -> int:
    """An operand with a mix of magnitudes (one to four digits)."""
    digits = rng.choices((1, 2, 3, 4), weights=(2, 4, 4, 1))[0]
    low = 0 if digits == 1 else 10 ** (digits - 1)
    return rng.randint(low, 10**digits - 1)


def _operands(rng: random.Random, op: str) -> tuple[int, int]:
    if op == "*":
        a = rng.randint(2, rng.choice((12, 99, 999)))
        b = rng.randint(2, rng.choice((12, 99, 999)))
        return a, b
    if op == "/":
        b = rng.randint(2, rng.choice((12, 50)))
        quotient = rng.randint(1, rng.choice((20, 200)))
        return b * quotient, b
    return operand(rng), operand(rng)


def _binary(rng: random.Random) -> Problem:
    op = rng.choices(("+", "-", "*", "/"), weights=(3, 3, 3, 1))[0]
    a, b = _operands(rng, op)
    expression = f"{a} {op} {b}"
    style = rng.random()
    if style < 0.45:
        question = rng.choice(_SYMBOLIC).format(e=expression)
    elif style < 0.75:
        question = rng.choice(_WORDED).format(a=a, w=rng.choice(_OP_WORDS[op]), b=b)
    else:
        question = rng.choice(_SEMANTIC[op]).format(a=a, b=b)
    return Problem.make("single", question, (expression,))


_TERNARY_SHAPES: Final = (
    "({a} + {b}) * {c}",
    "({a} - {b}) * {c}",
    "{a} * {b} + {c}",
    "{a} + {b} * {c}",
    "{a} * ({b} - {c})",
    "{a} + {b} - {c}",
)


def _ternary(rng: random.Random) -> Problem:
    a, b, c = (rng.randint(1, rng.choice((9, 99, 999))) for _ in range(3))
    expression = _TERNARY_SHAPES[rng.randrange(len(_TERNARY_SHAPES))].format(a=a, b=b, c=c)
    return Problem.make("single", rng.choice(_SYMBOLIC).format(e=expression), (expression,))


def _chain(rng: random.Random) -> Problem:
    op1 = rng.choice(("+", "-", "*"))
    a, b = _operands(rng, op1)
    first = f"{a} {op1} {b}"
    op2 = rng.choice(("+", "-", "*"))
    c = rng.randint(2, 99)
    step = rng.choice(_CHAIN_STEPS[op2])
    if "double" in step:
        c = 2
    step = step.format(c=c)
    question = rng.choice(_CHAIN_FRAMES).format(e=first, step=step)
    return Problem.make("chain", question, (first, f"{{r}} {op2} {c}"))


def _parallel(rng: random.Random) -> Problem:
    exprs = []
    for op in rng.choices(("+", "-", "*"), k=2):
        a, b = _operands(rng, op)
        exprs.append(f"{a} {op} {b}")
    question = rng.choice(_PARALLEL_FRAMES).format(e1=exprs[0], e2=exprs[1])
    return Problem.make("parallel", question, exprs)


_GENERATORS: Final[dict[str, Callable[[random.Random], Problem]]] = {
    "binary": _binary,
    "ternary": _ternary,
    "chain": _chain,
    "parallel": _parallel,
}
TRAIN_MIX: Final[dict[str, float]] = {
    "binary": 0.66,
    "ternary": 0.14,
    "chain": 0.12,
    "parallel": 0.08,
}
"""Share of each problem shape in the training corpus."""
EVAL_MIX: Final[dict[str, float]] = {"binary": 0.85, "ternary": 0.15}
"""Share of each shape in the shipped prompt set (single-call problems only)."""


def generate_problems(
    n: int, *, seed: int, split: Split, mix: dict[str, float] | None = None
) -> list[Problem]:
    """``n`` distinct problems of the given split, deterministic in ``seed``."""
    rng = random.Random(seed)
    mix = TRAIN_MIX if mix is None else mix
    names = list(mix)
    weights = [mix[name] for name in names]

    def draw() -> Problem | None:
        problem = _GENERATORS[rng.choices(names, weights=weights)[0]](rng)
        if problem.split != split or any(r.startswith("Error") for r in problem.results):
            return None
        return problem

    return draw_distinct(n, draw, lambda p: p.question, f"{split} problems")
