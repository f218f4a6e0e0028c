"""Deterministic synthetic data for the demo model: calculator, python and search tasks.

Everything here is driven by a seeded :class:`random.Random`, so the training corpus, the
tokenizer trained on it and the shipped prompt sets are reproducible bit for bit.

There are three task families, each rendered with the tool list its tool config shows:
``calculator`` (below), ``python`` (:mod:`toolrollout.apps.demo.code_tasks`: the sandbox tool)
and ``search`` (:mod:`toolrollout.apps.demo.search_tasks`: the demo corpus). A
:class:`Dialog` records its family so the training script renders it with that family's
tools (:func:`family_tools`).

The calculator family: a :class:`Problem` is an arithmetic question in natural language
with the calculator expression(s) that answer it. A dialog renders a problem as chat
messages: the assistant calls ``calculator``, the tool message carries the calculator's
real output, and the assistant's final turn states that output. Three shapes exist:

* ``single``: one call (``"What is 37 * 12?"`` → ``calculator("37 * 12")`` → ``"444"``);
* ``chain``: two sequential calls, the second one using the first result
  (``"Compute 12 * 7, then add 5 to the result."``);
* ``parallel``: two independent calls in one assistant turn, whose two tool results are
  merged into one user turn by the chat template.

Held-out problems are chosen by hashing each canonical expression (:func:`is_heldout`):
a training problem never contains a held-out expression, so the shipped prompts (drawn
only from the held-out side) were never seen during training. The other families hold
out programs and corpus questions the same way.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from toolrollout.tools.calculator import CALCULATOR_TOOL, calculator

if TYPE_CHECKING:
    from toolrollout.apps.demo.code_tasks import CodeTask
    from toolrollout.apps.demo.search_tasks import SearchTask

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "FAMILIES",
    "TRAIN_FAMILY_MIX",
    "Dialog",
    "Family",
    "Problem",
    "copy_dialogs",
    "dialog_messages",
    "family_tools",
    "generate_problems",
    "is_heldout",
    "make_prompt_rows",
    "make_python_prompt_rows",
    "make_search_prompt_rows",
    "python_dialog",
    "search_dialog",
    "training_dialogs",
    "write_prompts",
]

Kind = Literal["single", "chain", "parallel"]
Split = Literal["train", "heldout"]

DEFAULT_SYSTEM_PROMPT: Final = "You are a helpful assistant."
"""System message of the shipped prompts (the chat template's default text too)."""

_TRAIN_SYSTEM_PROMPTS: Final = (
    DEFAULT_SYSTEM_PROMPT,
    DEFAULT_SYSTEM_PROMPT,
    "You are a math assistant. Use the calculator for arithmetic.",
    "You answer arithmetic questions with the help of a calculator tool.",
    None,  # no system message: the template falls back to its default text
)

HELDOUT_PERCENT: Final = 10
"""Share of canonical expressions reserved for evaluation."""


def is_heldout(expression: str) -> bool:
    """Whether a canonical expression belongs to the held-out split (stable hash, ~10%)."""
    digest = hashlib.sha256(f"toolrollout-demo|{expression}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % 100 < HELDOUT_PERCENT


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


def _number(rng: random.Random) -> int:
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
    return _number(rng), _number(rng)


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


def _ternary_expression(rng: random.Random) -> str:
    a, b, c = (rng.randint(1, rng.choice((9, 99, 999))) for _ in range(3))
    shape = rng.randrange(6)
    if shape == 0:
        return f"({a} + {b}) * {c}"
    if shape == 1:
        return f"({a} - {b}) * {c}"
    if shape == 2:
        return f"{a} * {b} + {c}"
    if shape == 3:
        return f"{a} + {b} * {c}"
    if shape == 4:
        return f"{a} * ({b} - {c})"
    return f"{a} + {b} - {c}"


def _ternary(rng: random.Random) -> Problem:
    expression = _ternary_expression(rng)
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
    ops = rng.choices(("+", "-", "*"), k=2)
    exprs = []
    for op in ops:
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
    problems: list[Problem] = []
    seen: set[str] = set()
    attempts = 0
    while len(problems) < n:
        attempts += 1
        if attempts > 100 * n + 1000:
            raise RuntimeError(f"could not draw {n} distinct {split} problems")
        problem = _GENERATORS[rng.choices(names, weights=weights)[0]](rng)
        if problem.split != split or problem.question in seen:
            continue
        if any(r.startswith("Error") for r in problem.results):
            continue
        seen.add(problem.question)
        problems.append(problem)
    return problems


# ---------------------------------------------------------------------------------------
# Dialogs

_FINAL_SINGLE: Final = (
    "The answer is {r}.",
    "The answer is {r}.",
    "The result is {r}.",
    "It comes to {r}.",
)
_FINAL_PARALLEL: Final = (
    "The results are {r1} and {r2}.",
    "The first is {r1} and the second is {r2}.",
)


def _call_message(expressions: Sequence[str]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": "calculator", "arguments": {"expression": e}}}
            for e in expressions
        ],
    }


def _tool_messages(results: Iterable[str]) -> list[dict[str, Any]]:
    return [{"role": "tool", "name": "calculator", "content": r} for r in results]


def prompt_messages(
    problem: Problem, system: str | None = DEFAULT_SYSTEM_PROMPT
) -> list[dict[str, Any]]:
    """The conversation up to the first assistant turn: optional system, then the user."""
    messages: list[dict[str, Any]] = []
    if system is not None:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": problem.question})
    return messages


def dialog_messages(
    problem: Problem, rng: random.Random, system: str | None = DEFAULT_SYSTEM_PROMPT
) -> list[dict[str, Any]]:
    """The full dialog for ``problem``, with the calculator's real outputs as tool messages."""
    messages = prompt_messages(problem, system)
    calls, results = problem.calls, problem.results
    if problem.kind == "parallel":
        messages.append(_call_message(calls))
        messages.extend(_tool_messages(results))
        final = rng.choice(_FINAL_PARALLEL).format(r1=results[0], r2=results[1])
    else:
        for call, result in zip(calls, results, strict=True):
            messages.append(_call_message([call]))
            messages.extend(_tool_messages([result]))
        final = rng.choice(_FINAL_SINGLE).format(r=results[-1])
    messages.append({"role": "assistant", "content": final})
    return messages


Family = Literal["calculator", "python", "search"]
FAMILIES: Final[tuple[Family, ...]] = ("calculator", "python", "search")
"""The task families, in the order their prompt files are listed."""

TRAIN_FAMILY_MIX: Final[dict[Family, float]] = {"calculator": 0.4, "python": 0.25, "search": 0.35}
"""Share of each family among the training dialogs."""

_PYTHON_SYSTEM_PROMPTS: Final = (
    DEFAULT_SYSTEM_PROMPT,
    DEFAULT_SYSTEM_PROMPT,
    "You solve problems by writing short Python programs.",
    "You are a coding assistant. Run Python to compute answers.",
    None,
)
_SEARCH_SYSTEM_PROMPTS: Final = (
    DEFAULT_SYSTEM_PROMPT,
    DEFAULT_SYSTEM_PROMPT,
    "Answer questions by searching the document collection.",
    "You are a research assistant. Look facts up before answering.",
    None,
)


@dataclass(frozen=True, slots=True)
class Dialog:
    """One training conversation and the family whose tools it is rendered with."""

    family: Family
    messages: list[dict[str, Any]]


def family_tools(family: Family) -> list[dict[str, Any]]:
    """The tool schemas a family's dialogs are rendered with: those its tool config shows
    (``tool_configs/calculator.yaml``, ``sandbox.yaml``, ``search.yaml``)."""
    if family == "calculator":
        return [CALCULATOR_TOOL]
    if family == "python":
        from toolrollout.apps.demo.code_tasks import sandbox_schema

        return [sandbox_schema()]
    from toolrollout.apps.demo.search_tasks import search_schema

    return [search_schema()]


def _question_messages(question: str, system: str | None) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if system is not None:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": question})
    return messages


def _single_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}],
    }


def python_dialog(
    task: CodeTask, system: str | None = DEFAULT_SYSTEM_PROMPT
) -> list[dict[str, Any]]:
    """Question, one ``python`` call with the program, the sandbox's output, the bare answer."""
    return [
        *_question_messages(task.question, system),
        _single_call("python", {"code": task.code}),
        {"role": "tool", "name": "python", "content": task.result},
        {"role": "assistant", "content": task.answer},
    ]


def search_dialog(
    task: SearchTask, system: str | None = DEFAULT_SYSTEM_PROMPT
) -> list[dict[str, Any]]:
    """Question, one ``search`` call per hop with the retriever's hits, the bare answer."""
    messages = _question_messages(task.question, system)
    for query, result in zip(task.queries, task.results, strict=True):
        messages.append(_single_call("search", {"query_list": [query]}))
        messages.append({"role": "tool", "name": "search", "content": result})
    messages.append({"role": "assistant", "content": task.answer})
    return messages


def training_dialogs(
    n: int, *, seed: int, families: Sequence[Family] = ("calculator",)
) -> list[Dialog]:
    """``n`` training dialogs (train split only) of the given families.

    Family counts follow :data:`TRAIN_FAMILY_MIX` (renormalised over ``families``);
    system messages vary per dialog. With several families the dialogs are shuffled with
    the seed; calculator alone keeps generation order (the shipped model's recipe).
    """
    from toolrollout.apps.demo.code_tasks import generate_code_tasks
    from toolrollout.apps.demo.search_tasks import generate_search_tasks

    unknown = sorted(set(families) - set(FAMILIES))
    if unknown or not families:
        raise ValueError(f"unknown task families {unknown}; choose from {', '.join(FAMILIES)}")
    chosen = [f for f in FAMILIES if f in families]
    total = sum(TRAIN_FAMILY_MIX[f] for f in chosen)
    counts = {f: round(n * TRAIN_FAMILY_MIX[f] / total) for f in FAMILIES if f in chosen}
    counts[chosen[0]] += n - sum(counts.values())  # the rounding remainder
    n_calc, n_python, n_search = (counts.get(f, 0) for f in FAMILIES)
    rng = random.Random(seed + 1)
    dialogs = [
        Dialog("calculator", dialog_messages(p, rng, rng.choice(_TRAIN_SYSTEM_PROMPTS)))
        for p in generate_problems(n_calc, seed=seed, split="train")
    ]
    dialogs += [
        Dialog("python", python_dialog(t, rng.choice(_PYTHON_SYSTEM_PROMPTS)))
        for t in generate_code_tasks(n_python, seed=seed + 3, split="train")
    ]
    dialogs += [
        Dialog("search", search_dialog(t, rng.choice(_SEARCH_SYSTEM_PROMPTS)))
        for t in generate_search_tasks(n_search, seed=seed + 4, split="train")
    ]
    if len(chosen) > 1:
        rng.shuffle(dialogs)
    return dialogs


def make_prompt_rows(n: int = 64, *, seed: int = 1234) -> list[dict[str, Any]]:
    """The shipped calculator prompts: ``n`` single-call held-out problems."""
    rows = []
    for i, problem in enumerate(generate_problems(n, seed=seed, split="heldout", mix=EVAL_MIX)):
        rows.append(
            {
                "id": f"calc-{i:03d}",
                "messages": prompt_messages(problem),
                "answer": problem.answer,
                "expression": problem.calls[0],
            }
        )
    return rows


def make_python_prompt_rows(n: int = 64, *, seed: int = 1234) -> list[dict[str, Any]]:
    """The shipped python prompts: ``n`` held-out programs' questions."""
    from toolrollout.apps.demo.code_tasks import generate_code_tasks

    return [
        {
            "id": f"python-{i:03d}",
            "messages": _question_messages(task.question, DEFAULT_SYSTEM_PROMPT),
            "answer": task.answer,
            "code": task.code,
        }
        for i, task in enumerate(generate_code_tasks(n, seed=seed, split="heldout"))
    ]


def make_search_prompt_rows() -> list[dict[str, Any]]:
    """The shipped search prompts: every held-out corpus question, in the corpus's wording."""
    from toolrollout.apps.demo.search_tasks import generate_search_tasks

    tasks = generate_search_tasks(10**6, seed=0, split="heldout", canonical_only=True)
    return [
        {
            "id": f"search-{i:03d}",
            "messages": _question_messages(task.question, DEFAULT_SYSTEM_PROMPT),
            "answer": task.answer,
            "queries": list(task.queries),
            "hops": task.hops,
        }
        for i, task in enumerate(tasks)
    ]


def _write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def write_prompts(paths: dict[Family, Path]) -> None:
    """Write each family's held-out prompt set as JSON lines to ``paths[family]``."""
    makers: dict[Family, Callable[[], list[dict[str, Any]]]] = {
        "calculator": make_prompt_rows,
        "python": make_python_prompt_rows,
        "search": make_search_prompt_rows,
    }
    for family, path in paths.items():
        _write_jsonl(path, makers[family]())


_COPY_FRAMES: Final = ("Repeat: {s}", "Say {s}", "Copy this: {s}", "Echo {s}")


def _copy_string(rng: random.Random) -> str:
    terms = [str(_number(rng)) for _ in range(rng.randint(1, 4))]
    text = terms[0]
    for term in terms[1:]:
        text += f" {rng.choice('+-*/')} {term}"
    if len(terms) > 2 and rng.random() < 0.3:
        text = f"({text})"
    return text


def copy_dialogs(n: int, *, seed: int) -> list[list[dict[str, Any]]]:
    """``n`` short "repeat after me" dialogs (no tools) with random numbers and operators.

    The training script starts with these: every assistant token is a copy of the user's
    text, a dense signal that teaches the copying circuit (induction heads) in a few hundred
    cheap steps, instead of waiting for it to emerge from the sparse digits of the tool
    dialogs. Nothing here depends on the train/held-out split: the strings are random.
    """
    rng = random.Random(seed + 2)
    dialogs = []
    for _ in range(n):
        text = _copy_string(rng)
        dialogs.append(
            [
                {"role": "user", "content": rng.choice(_COPY_FRAMES).format(s=text)},
                {"role": "assistant", "content": text},
            ]
        )
    return dialogs
