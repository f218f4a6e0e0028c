"""The bundled demo: a tiny tool-calling model, its calculator tool and a prompt set.

The model is shipped inside the package so that examples, tests and the CPU engine can run
a real multi-turn tool-calling rollout without downloading anything. It is a 1.5 MB
Qwen2-architecture causal LM trained by :mod:`toolrollout.demo.train` on synthetic
arithmetic dialogs; its chat template uses the Qwen2.5 tool-call format
(``<tool_call>{"name": ..., "arguments": ...}</tool_call>``, tool results as
``<tool_response>`` inside a user turn), so code written against the demo works unchanged
with real Qwen2.5 models.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

from toolrollout.demo.calculator import CALCULATOR_TOOL, calculator

__all__ = [
    "CALCULATOR_TOOL",
    "DEMO_CHAT_TEMPLATE_PATH",
    "DEMO_MODEL_PATH",
    "DEMO_PROMPTS_PATH",
    "calculator",
    "load_demo_prompts",
]

_HERE: Final = Path(__file__).resolve().parent

DEMO_MODEL_PATH: Final[Path] = _HERE / "model"
"""Hugging Face model folder (config, safetensors weights, tokenizer with chat template)."""
DEMO_PROMPTS_PATH: Final[Path] = _HERE / "prompts.jsonl"
"""Held-out calculator prompts, one JSON object per line (never seen in training)."""
DEMO_CHAT_TEMPLATE_PATH: Final[Path] = _HERE / "chat_template.jinja"
"""Source of the chat template that the training script copies into the tokenizer."""


def load_demo_prompts() -> list[dict[str, Any]]:
    """Read the demo prompt set.

    Each row has ``id``, ``messages`` (system + user), ``expression`` (the canonical
    calculator input) and ``answer`` (the calculator's output for it, as a string). The
    tools are always ``[CALCULATOR_TOOL]`` and are not repeated per row.
    """
    with DEMO_PROMPTS_PATH.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
