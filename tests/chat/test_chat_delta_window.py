"""Windowed tool-turn deltas: equal to full renders, flat in cost, and self-disabling."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from tests.chat.conftest import QWEN_ADDED, QWEN_SPECIAL, TEMPLATES, build_tokenizer
from transformers import PreTrainedTokenizerBase

from toolrollout.chat import ChatFormat

Message = dict[str, Any]
TURNS = 24


def tool_loop(family: str) -> list[tuple[Message, list[Message]]]:
    """``TURNS`` assistant turns, each a tool call (Llama: one call) answered by results."""
    turns = []
    for i in range(TURNS):
        call = {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "add", "arguments": {"a": i, "b": i + 1}},
        }
        message: Message = {
            "role": "assistant",
            "content": "" if family == "llama3" else f"step {i}",
        }
        message["tool_calls"] = [call]
        results = [{"role": "tool", "tool_call_id": f"call_{i}", "content": str(2 * i + 1)}]
        if family != "llama3" and i % 5 == 4:  # sometimes two results merge into one turn
            results.append({"role": "tool", "tool_call_id": f"call_{i}", "content": "again"})
        if i % 7 == 6:  # and sometimes the user follows up instead
            results = [{"role": "user", "content": f"Now add {i} more."}]
        turns.append((message, results))
    return turns


def deltas(fmt: ChatFormat, family: str, system: bool) -> list[list[int]]:
    messages: list[Message] = [{"role": "user", "content": "Add numbers for me."}]
    if system:
        messages.insert(0, {"role": "system", "content": "You are careful."})
    out = []
    for message, results in tool_loop(family):
        messages.append(message)
        out.append(fmt.tool_turn_delta(messages, results))
        messages.extend(results)
    return out


@pytest.mark.parametrize("family", ["qwen25", "qwen3", "llama3"])
@pytest.mark.parametrize("system", [False, True])
def test_windowed_deltas_equal_full_renders(
    family: str, system: bool, request: pytest.FixtureRequest, tools: list[Any]
) -> None:
    tokenizer: PreTrainedTokenizerBase = request.getfixturevalue(f"{family}_tokenizer")
    windowed = ChatFormat(tokenizer, tools=tools)
    full = ChatFormat(tokenizer, tools=tools, windowed_deltas=False)
    assert deltas(windowed, family, system) == deltas(full, family, system)
    assert windowed.windowed_deltas  # the cross-checks agreed, so the window stays on
    assert not full.windowed_deltas


def test_render_cost_does_not_grow_with_the_conversation(
    qwen25_tokenizer: PreTrainedTokenizerBase, tools: list[Any]
) -> None:
    """After the cross-checks, a delta renders a few messages however long the chat is."""
    fmt = ChatFormat(qwen25_tokenizer, tools=tools)
    rendered: list[int] = []
    original = ChatFormat.render_text

    def counting(self: ChatFormat, messages: Sequence[Message], **kwargs: Any) -> str:
        rendered.append(len(messages))
        return original(self, messages, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ChatFormat, "render_text", counting)
        per_turn = []
        messages: list[Message] = [{"role": "user", "content": "Add numbers for me."}]
        for message, results in tool_loop("qwen25"):
            messages.append(message)
            before = len(rendered)
            fmt.tool_turn_delta(messages, results)
            per_turn.append(max(rendered[before:]))
            messages.extend(results)
    assert len(messages) > 2 * TURNS
    # Full renders while checking, then only windows: [user, assistant] + the new messages.
    assert max(per_turn[8:]) <= 4
    assert max(per_turn[:4]) > 4


def test_history_dependent_template_falls_back_to_full_renders(tools: list[Any]) -> None:
    """A template that numbers tool results across the whole chat cannot be windowed."""
    template = (TEMPLATES / "qwen25.jinja").read_text()
    counted = template.replace(
        '"\\n<tool_response>\\n" + message.content',
        '"\\n<tool_response>" + (loop.index | string) + "\\n" + message.content',
    )
    assert counted != template
    tokenizer = build_tokenizer(
        special=QWEN_SPECIAL, added=QWEN_ADDED, template=counted, eos="<|im_end|>"
    )
    windowed = ChatFormat(tokenizer, tools=tools)
    full = ChatFormat(tokenizer, tools=tools, windowed_deltas=False)
    assert deltas(windowed, "qwen25", False) == deltas(full, "qwen25", False)
    assert not windowed.windowed_deltas
