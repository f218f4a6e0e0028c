"""Deterministic synthetic data for the demo model: calculator, python and search tasks.

Everything here is driven by a seeded :class:`random.Random`, so the training corpus, the
tokenizer trained on it and the shipped prompt sets are reproducible bit for bit. The tasks
of each family come from :mod:`~toolrollout.apps.demo.calculator_tasks`,
:mod:`~toolrollout.apps.demo.code_tasks` and :mod:`~toolrollout.apps.demo.search_tasks`,
which hold out problems by a stable hash (the shipped prompts were never seen in training);
this module renders them as dialogs, each with its family's tools (:func:`family_tools`).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from toolrollout.apps.demo.calculator_tasks import EVAL_MIX, Problem, generate_problems, operand
from toolrollout.tools.calculator import CALCULATOR_TOOL

if TYPE_CHECKING:
    from toolrollout.apps.demo.code_tasks import CodeTask
    from toolrollout.apps.demo.search_tasks import SearchTask

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "FAMILIES",
    "TRAIN_FAMILY_MIX",
    "Dialog",
    "Family",
    "copy_dialogs",
    "dialog_messages",
    "family_tools",
    "make_prompt_rows",
    "make_python_prompt_rows",
    "make_search_prompt_rows",
    "python_dialog",
    "search_dialog",
    "training_dialogs",
    "write_prompts",
]

DEFAULT_SYSTEM_PROMPT: Final = "You are a helpful assistant."
"""System message of the shipped prompts (the chat template's default text too)."""

_TRAIN_SYSTEM_PROMPTS: Final = (
    DEFAULT_SYSTEM_PROMPT,
    DEFAULT_SYSTEM_PROMPT,
    "You are a math assistant. Use the calculator for arithmetic.",
    "You answer arithmetic questions with the help of a calculator tool.",
    None,  # no system message: the template falls back to its default text
)


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


def _calculator_calls(expressions: Iterable[str]) -> dict[str, Any]:
    return _call_message("calculator", *({"expression": e} for e in expressions))


def _calculator_results(results: Iterable[str]) -> list[dict[str, Any]]:
    return [{"role": "tool", "name": "calculator", "content": r} for r in results]


def dialog_messages(
    problem: Problem, rng: random.Random, system: str | None = DEFAULT_SYSTEM_PROMPT
) -> list[dict[str, Any]]:
    """The full dialog for ``problem``, with the calculator's real outputs as tool messages."""
    messages = _question_messages(problem.question, system)
    calls, results = problem.calls, problem.results
    if problem.kind == "parallel":
        messages.append(_calculator_calls(calls))
        messages.extend(_calculator_results(results))
        final = rng.choice(_FINAL_PARALLEL).format(r1=results[0], r2=results[1])
    else:
        for call, result in zip(calls, results, strict=True):
            messages.append(_calculator_calls([call]))
            messages.extend(_calculator_results([result]))
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


def _call_message(name: str, *arguments: dict[str, Any]) -> dict[str, Any]:
    """An assistant turn of calls to ``name``, one per ``arguments``, and no text."""
    calls = [{"type": "function", "function": {"name": name, "arguments": a}} for a in arguments]
    return {"role": "assistant", "content": "", "tool_calls": calls}


def python_dialog(
    task: CodeTask, system: str | None = DEFAULT_SYSTEM_PROMPT
) -> list[dict[str, Any]]:
    """Question, one ``python`` call with the program, the sandbox's output, the bare answer."""
    return [
        *_question_messages(task.question, system),
        _call_message("python", {"code": task.code}),
        {"role": "tool", "name": "python", "content": task.result},
        {"role": "assistant", "content": task.answer},
    ]


def search_dialog(
    task: SearchTask, system: str | None = DEFAULT_SYSTEM_PROMPT
) -> list[dict[str, Any]]:
    """Question, one ``search`` call per hop with the retriever's hits, the bare answer."""
    messages = _question_messages(task.question, system)
    for query, result in zip(task.queries, task.results, strict=True):
        messages.append(_call_message("search", {"query_list": [query]}))
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


def _prompt_row(prefix: str, i: int, question: str, answer: Any, **extra: Any) -> dict[str, Any]:
    messages = _question_messages(question, DEFAULT_SYSTEM_PROMPT)
    return {"id": f"{prefix}-{i:03d}", "messages": messages, "answer": answer, **extra}


def make_prompt_rows(n: int = 64, *, seed: int = 1234) -> list[dict[str, Any]]:
    """The shipped calculator prompts: ``n`` single-call held-out problems."""
    problems = generate_problems(n, seed=seed, split="heldout", mix=EVAL_MIX)
    return [
        _prompt_row("calc", i, p.question, p.answer, expression=p.calls[0])
        for i, p in enumerate(problems)
    ]


def make_python_prompt_rows(n: int = 64, *, seed: int = 1234) -> list[dict[str, Any]]:
    """The shipped python prompts: ``n`` held-out programs' questions."""
    from toolrollout.apps.demo.code_tasks import generate_code_tasks

    tasks = generate_code_tasks(n, seed=seed, split="heldout")
    return [
        _prompt_row("python", i, t.question, t.answer, code=t.code) for i, t in enumerate(tasks)
    ]


def make_search_prompt_rows() -> list[dict[str, Any]]:
    """The shipped search prompts: every held-out corpus question, in the corpus's wording."""
    from toolrollout.apps.demo.search_tasks import generate_search_tasks

    tasks = generate_search_tasks(10**6, seed=0, split="heldout", canonical_only=True)
    return [
        _prompt_row("search", i, t.question, t.answer, queries=list(t.queries), hops=t.hops)
        for i, t in enumerate(tasks)
    ]


def write_prompts(paths: dict[Family, Path]) -> None:
    """Write each family's held-out prompt set as JSON lines to ``paths[family]``."""
    makers: dict[Family, Callable[[], list[dict[str, Any]]]] = {
        "calculator": make_prompt_rows,
        "python": make_python_prompt_rows,
        "search": make_search_prompt_rows,
    }
    for family, path in paths.items():
        with path.open("w", encoding="utf-8") as f:
            f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in makers[family]())


_COPY_FRAMES: Final = ("Repeat: {s}", "Say {s}", "Copy this: {s}", "Echo {s}")


def _copy_string(rng: random.Random) -> str:
    terms = [str(operand(rng)) for _ in range(rng.randint(1, 4))]
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
