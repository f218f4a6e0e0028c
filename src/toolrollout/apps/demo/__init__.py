"""The bundled demo: a tiny tool-calling model and its prompt sets (its calculator tool is
:mod:`toolrollout.tools.calculator`).

The model is shipped inside the package so that examples, tests and the CPU engine can run
a real multi-turn tool-calling rollout without downloading anything. It is trained by
:mod:`toolrollout.apps.demo.train` and uses the Qwen2.5 tool-call format, so code written
against the demo works unchanged with real Qwen2.5 models (docs/quickstart.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final, Literal

__all__ = [
    "DEMO_CHAT_TEMPLATE_PATH",
    "DEMO_MODEL_PATH",
    "DEMO_PROMPTS_PATH",
    "DEMO_PROMPT_SETS",
    "DemoTask",
    "demo_prompts_for_tools",
    "load_demo_prompts",
]

DemoTask = Literal["calculator", "python", "search"]
"""The demo model's task families, named after the tool each one uses."""

_HERE: Final = Path(__file__).resolve().parent

DEMO_MODEL_PATH: Final[Path] = _HERE / "model"
"""Hugging Face model folder (config, safetensors weights, tokenizer with chat template)."""
DEMO_PROMPTS_PATH: Final[Path] = _HERE / "prompts.jsonl"
"""Held-out calculator prompts, one JSON object per line (never seen in training)."""
DEMO_PROMPT_SETS: Final[dict[DemoTask, Path]] = {
    "calculator": DEMO_PROMPTS_PATH,
    "python": _HERE / "prompts_python.jsonl",
    "search": _HERE / "prompts_search.jsonl",
}
"""Held-out prompts per task family (``tool_configs/calculator.yaml``, ``sandbox.yaml``,
``search.yaml`` and the MCP calculator configs use them)."""
DEMO_CHAT_TEMPLATE_PATH: Final[Path] = _HERE / "chat_template.jinja"
"""Source of the chat template that the training script copies into the tokenizer."""


def load_demo_prompts(task: DemoTask = "calculator") -> list[dict[str, Any]]:
    """Read one task family's held-out prompt set.

    Each row has ``id``, ``messages`` (system + user) and ``answer`` (the tool-derived
    answer, as a string), plus what solves it: ``expression`` (calculator input),
    ``code`` (the reference program) or ``queries`` and ``hops`` (the searches). The
    tools are not repeated per row: they are the family's tool config.
    """
    with DEMO_PROMPT_SETS[task].open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def demo_prompts_for_tools(tool_names: Iterable[str]) -> Path:
    """The demo prompt set that suits a tool list: the ``python`` prompts when a tool is
    named ``python``, else the ``search`` prompts for a ``search`` tool, else the
    calculator prompts (what ``toolrollout generate`` uses without ``--dataset``)."""
    names = set(tool_names)
    preferred: tuple[DemoTask, ...] = ("python", "search")
    return next((DEMO_PROMPT_SETS[t] for t in preferred if t in names), DEMO_PROMPTS_PATH)
