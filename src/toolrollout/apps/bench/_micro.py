"""Per-turn client work as the conversation grows: turn 1 against turn N.

A client that re-renders or re-tokenizes the whole conversation every turn gets slower as
trajectories grow; one that only appends does not. This times the client-side token work of
one turn of :mod:`toolrollout.rollout` (decode the model's ids, parse the tool calls, build
the tool turn's token delta, record the drift check's checkpoint) at turn 1 and at turn
``N`` of one scripted conversation, medians of repeats; beside it the full drift check
after every turn (``drift_every_turn_s``) and the one at the end (``final_drift_check_s``).
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
    from types import SimpleNamespace

    from toolrollout.chat import ChatFormat, check_drift
    from toolrollout.chat.parsers import get_tool_parser
    from toolrollout.rollout import RolloutConfig, RolloutPrompt, TokenSpan
    from toolrollout.rollout._state import TrajectoryState

    from ._tools import LookupClient

    chat = ChatFormat(tokenizer, tools=[LookupClient("http://127.0.0.1:1").tool().schema()])
    parser = get_tool_parser("qwen25")
    script = TurnScript(tokenizer)
    item = WorkloadItem("micro", turns + 1, 48)
    messages: list[dict[str, Any]] = [dict(m) for m in item.prompt()]
    transcript = chat.render_prompt(messages)
    services: Any = SimpleNamespace(config=RolloutConfig(), chat=chat, vision=None)
    state = TrajectoryState(
        services, RolloutPrompt(tuple(messages)), prompt_index=0, sample_index=0, group_id="micro"
    )
    state.transcript.messages = messages  # the loop's list: appended to below
    state.transcript.prompt_ids = list(transcript)
    model_texts: list[str] = []
    timings: dict[int, dict[str, float]] = {}
    for turn in range(1, turns + 1):
        output = script.output_ids(script.turn(item, turn - 1))

        def model_turn(output: list[int] = output) -> tuple[str, Any]:
            text = chat.model_text(output)
            return text, parser.parse(text)

        text, parsed = model_turn()
        transcript.extend(output)
        state.transcript.spans.append(TokenSpan("model", tuple(output), (0.0,) * len(output)))
        model_texts.append(text)
        call = parsed.tool_calls[0]
        function = {"name": call.name, "arguments": call.arguments}
        calls = [{"id": call.id, "type": "function", "function": function}]
        messages.append({"role": "assistant", "content": parsed.content, "tool_calls": calls})
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

        def checkpoint() -> None:
            state.checkpoint()
            state.drift.checkpoints.pop()  # time one record, keep one per turn

        messages.append(tool)
        state.transcript.spans.append(TokenSpan("tool", tuple(ids), (0.0,) * len(ids)))
        if turn in (1, turns):
            messages.pop()  # time the delta and the check on the turn as it was
            timings[turn] = {
                "parse_s": _median_seconds(model_turn, repeats),
                "delta_s": _median_seconds(delta, repeats),
                "drift_s": _median_seconds(checkpoint, repeats),
                "drift_every_turn_s": _median_seconds(drift, repeats),
            }
            messages.append(tool)
        state.checkpoint()
        transcript.extend(ids)
    return _cost_summary(timings[1], timings[turns], turns, len(transcript))


def _cost_summary(
    first: dict[str, float], last: dict[str, float], turns: int, tokens: int
) -> dict[str, Any]:
    """The timings of turn 1 and turn ``turns``, and how much more the last one costs."""

    def ratio(*keys: str) -> float:
        return sum(last[k] for k in keys) / sum(first[k] for k in keys)

    final = last["drift_every_turn_s"]  # the end check renders what turn N's check did
    return {
        "turns": turns,
        "transcript_tokens": tokens,
        "turn_1": first,
        f"turn_{turns}": last,
        "ratio_without_drift_check": ratio("parse_s", "delta_s"),
        "ratio_with_drift_check": ratio("parse_s", "delta_s", "drift_s"),
        "ratio_with_drift_check_every_turn": ratio("parse_s", "delta_s", "drift_every_turn_s"),
        "final_drift_check_s": final,
        "final_drift_check_per_turn_s": final / turns,
    }
