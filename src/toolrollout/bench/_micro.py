"""Per-turn client work as the conversation grows: turn 1 against turn N.

A rollout client that re-renders or re-tokenizes the whole conversation every turn gets
slower as trajectories get longer; one that only appends does not. This times exactly the
client-side token work of one turn of :mod:`toolrollout.rollout` (decode the model's ids,
parse tool calls, build the tool turn's token delta, and optionally the drift check) at
turn 1 and at turn ``N`` of the same scripted conversation, medians of repeats, in one
process, one after the other.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from ._model import WorkloadItem
from ._script import TurnScript
from ._tools import lookup_result

__all__ = ["tokenization_cost"]


def _median_seconds(fn: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def tokenization_cost(tokenizer: Any, *, turns: int = 64, repeats: int = 15) -> dict[str, Any]:
    """Median seconds of one turn's token work at turn 1 and at turn ``turns``."""
    from toolrollout.chat import ChatFormat, check_drift, get_tool_parser

    from ._tools import LookupClient

    chat = ChatFormat(tokenizer, tools=[LookupClient("http://127.0.0.1:1").tool().schema()])
    parser = get_tool_parser("qwen25")
    script = TurnScript(tokenizer)
    item = WorkloadItem("micro", turns + 1, 48)
    messages: list[dict[str, Any]] = [dict(m) for m in item.prompt()]
    transcript = chat.render_prompt(messages)
    model_texts: list[str] = []
    timings: dict[int, dict[str, float]] = {}
    for turn in range(1, turns + 1):
        scripted = script.turn(item, turn - 1)
        output = script.output_ids(scripted.text)

        def model_turn(output: list[int] = output) -> tuple[str, Any]:
            text = chat.model_text(output)
            return text, parser.parse(text)

        text, parsed = model_turn()
        transcript.extend(output)
        model_texts.append(text)
        call = parsed.tool_calls[0]
        assistant = {
            "role": "assistant",
            "content": parsed.content,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
            ],
        }
        messages.append(assistant)
        tool = {
            "role": "tool",
            "tool_call_id": call.id,
            "name": call.name,
            "content": lookup_result(str(call.arguments["key"])),
        }

        def delta(tool: dict[str, Any] = tool) -> list[int]:
            return chat.tool_turn_delta(messages, [tool])

        ids = delta()
        after = [*messages, tool]
        full = [*transcript, *ids]

        def drift(full: list[int] = full, after: list[dict[str, Any]] = after) -> object:
            return check_drift(full, after, chat_format=chat, model_texts=model_texts)

        if turn in (1, turns):
            timings[turn] = {
                "parse_s": _median_seconds(model_turn, repeats),
                "delta_s": _median_seconds(delta, repeats),
                "drift_s": _median_seconds(drift, repeats),
            }
        messages.append(tool)
        transcript.extend(ids)
    first, last = timings[1], timings[turns]
    without = (last["parse_s"] + last["delta_s"]) / (first["parse_s"] + first["delta_s"])
    with_drift = sum(last.values()) / sum(first.values())
    return {
        "turns": turns,
        "transcript_tokens": len(transcript),
        "turn_1": first,
        f"turn_{turns}": last,
        "ratio_without_drift_check": without,
        "ratio_with_drift_check": with_drift,
    }
