"""Shared pieces of the per-family tests: a tokenizer trainer and a scripted-run helper.

Each family's test vendors its official template (``tests/chat/templates/official``, with
provenance in ``PROVENANCE.md``), trains a small tokenizer holding the family's real
control tokens (:func:`build_tokenizer`), scripts the model's turns as text, and runs them
through a real :class:`~toolrollout.rollout.RolloutRunner` with real Python tools
(:func:`run_family`). The check that matters is then made by the test itself: the
trajectory equals a fresh render of its own messages under the family's documented rule.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
from tests.chat.conftest import build_tokenizer as build_tokenizer

from toolrollout.rollout import RolloutConfig, RolloutRunner, Trajectory
from toolrollout.testing import ScriptedEngine, ScriptedOutput
from toolrollout.tools import Tool

__all__ = ["OFFICIAL", "build_tokenizer", "fresh_render_ids", "official_template", "run_family"]

OFFICIAL = Path(__file__).parent.parent / "templates" / "official"
"""Official chat templates, byte-identical, with their sources in ``PROVENANCE.md``."""


def official_template(name: str) -> str:
    """Read a vendored template and check its bytes against the sha256 in PROVENANCE.md."""
    path = OFFICIAL / name
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    provenance = (OFFICIAL / "PROVENANCE.md").read_text(encoding="utf-8")
    lines = [line for line in provenance.splitlines() if f"`{name}`" in line]
    assert lines, f"{name} has no line in PROVENANCE.md"
    assert digest in lines[0], f"{name}: sha256 {digest} is not the one PROVENANCE.md records"
    return data.decode("utf-8")


def run_family(
    tokenizer: Any,
    tools: Sequence[Tool],
    model_turns: Sequence[str],
    prompt: Sequence[dict[str, Any]],
    *,
    config: RolloutConfig | None = None,
    encode: Callable[[str], list[int]] | None = None,
) -> tuple[RolloutRunner, Trajectory, ScriptedEngine]:
    """Run one trajectory whose model turns are ``model_turns`` (text, stop token included).

    Each text is tokenized as the model would have sampled it (the canonical split, unless
    ``encode`` says otherwise) and given logprob -0.5 per token.
    """

    def out(text: str) -> ScriptedOutput:
        ids = (encode or (lambda t: tokenizer.encode(t, add_special_tokens=False)))(text)
        return ScriptedOutput(list(ids), logprobs=[-0.5] * len(ids))

    engine = ScriptedEngine([out(text) for text in model_turns])
    runner = RolloutRunner(engine, tokenizer, list(tools), config=config or RolloutConfig())
    [trajectory] = anyio.run(runner.run, [list(prompt)])
    return runner, trajectory, engine


def fresh_render_ids(tokenizer: Any, runner: RolloutRunner, trajectory: Trajectory) -> list[int]:
    """A fresh tokenization of ``trajectory.messages`` as the run's format renders them.

    Ends like the transcript: with the generation prompt after a non-assistant turn, and
    right after the stop token (the boundary cut off) after an assistant turn.
    """
    chat = runner.chat
    messages = list(trajectory.messages)
    if messages[-1]["role"] == "assistant":
        text = chat.render_text(messages, add_generation_prompt=False)
        boundary = chat.family.boundary
        if boundary and text.endswith(boundary):
            text = text[: -len(boundary)]
    else:
        text = chat.render_text(messages, add_generation_prompt=True)
    return chat.encode(text)
