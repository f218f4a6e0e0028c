"""The tool turn: run a model turn's tool calls and build the messages that answer it (limits
and parse errors become error messages the model reads). Appending the answer is
:meth:`TrajectoryState.append_env_turn`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import anyio

from toolrollout._exceptions import ToolUnavailable
from toolrollout._pacing import pace
from toolrollout._records import TrajectoryStatus
from toolrollout.tools import ToolCallRequest, ToolResult, ToolSession

from ._state import TrajectoryState
from ._types import EnvStep, ModelTurn, RolloutShared
from ._vision_turn import attach_images

__all__ = ["STOPPED_IN_TOOLS", "tool_step"]

STOPPED_IN_TOOLS = (
    "stopped by straggler control during its tool calls: the batch target was met; "
    "they run again when it resumes"
)


async def tool_step(
    state: TrajectoryState, turn: ModelTurn, session: ToolSession | None
) -> EnvStep | None:
    """Run the turn's tool calls (within the limits); None when the trajectory ends first."""
    if state.out_of_turns() or state.off_boundary(turn):
        return None
    shared, config = state.shared, state.shared.config
    requests = [
        ToolCallRequest(id=c.id, name=c.name, arguments=c.arguments) for c in turn.parsed.tool_calls
    ]
    over_turn = requests[config.max_tool_calls_per_turn :]
    requests = requests[: config.max_tool_calls_per_turn]
    room = max(config.max_tool_calls - state.counters.num_tool_calls, 0)
    over_total = requests[room:]
    requests = requests[:room]
    results = await _run_tools(state, requests, session)
    if results is None:
        return None
    await pace()  # the results' messages and the next delta take their turn on the loop
    state.counters.num_tool_calls += len(requests)
    if config.tool_unavailable == "fail" and _ended_on_infrastructure(state, requests, results):
        return None
    messages = [
        _tool_message(shared, request.id, request.name, result.text)
        for request, result in zip(requests, results, strict=True)
    ]
    for request in [*over_turn, *over_total]:
        state.counters.tool_errors += 1
        refused = f"Error: tool call limit reached; '{request.name}' was not run."
        messages.append(_tool_message(shared, request.id, request.name, refused))
    errors = [f"Error: could not parse tool call: {e.message}" for e in turn.parsed.errors]
    if errors and shared.chat.family.feedback_role == "user":
        messages.append({"role": "user", "content": _cut_text(shared, "\n".join(errors))})
    else:
        messages.extend(_tool_message(shared, None, None, error) for error in errors)
    images, image_errors = await attach_images(
        shared.vision, config, state.vision, results, messages
    )
    state.counters.tool_errors += image_errors
    return EnvStep("tool", tuple(messages), tuple(images))


async def _run_tools(
    state: TrajectoryState, calls: Sequence[ToolCallRequest], session: ToolSession | None
) -> list[ToolResult] | None:
    """The turn's tool calls, concurrently, results in call order. None when a batch
    target cancels them: the trajectory ends ``aborted`` as before the calls (only their
    number is recorded) and a resume runs them again."""
    state.status = TrajectoryStatus.TOOL_CALLING
    started = time.perf_counter()
    stop = state.shared.stop
    if stop is None or state.shared.config.tools_at_target == "finish":
        results = await state.shared.tools.run_calls(calls, state.tool_context(session))
    else:
        with anyio.CancelScope() as scope:
            stop.tool_calls.add(scope)
            try:
                if stop.stopping:  # met while this turn was being parsed
                    scope.cancel()
                results = await state.shared.tools.run_calls(calls, state.tool_context(session))
            finally:
                stop.tool_calls.discard(scope)
        if scope.cancelled_caught:
            state.counters.tool_calls_cancelled += len(calls)
            state.finish(TrajectoryStatus.ABORTED, "abort", STOPPED_IN_TOOLS)
            return None
    state.timing.tool_seconds += time.perf_counter() - started
    state.record_tool_results([call.name for call in calls], results)
    return results


def _ended_on_infrastructure(
    state: TrajectoryState, requests: Sequence[ToolCallRequest], results: Sequence[ToolResult]
) -> bool:
    """Fail the trajectory (not scored) when a call ended unavailable: not the model's fault."""
    for request, result in zip(requests, results, strict=True):
        if isinstance(result.error, ToolUnavailable):
            kind = type(result.error).__name__
            state.finish(
                TrajectoryStatus.FAILED,
                "tool_unavailable",
                f"tool {request.name!r} unavailable ({kind}): {result.error}",
            )
            return True
    return False


def _cut_text(shared: RolloutShared, text: str) -> str:
    """Bound one tool result to ``max_tool_response_tokens`` on the configured side."""
    config = shared.config
    limit = config.max_tool_response_tokens
    if text.isascii() and 2 * len(text) + 2 <= limit:
        # Within the limit without tokenizing: on ASCII text a tokenizer makes at most one
        # token a character plus a prefix piece (BPE, SentencePiece), so twice is a safe margin.
        return text
    ids = shared.chat.encode(text)
    if len(ids) <= limit:
        return text
    marker = "...(truncated)"
    if config.tool_response_truncate_side == "left":
        return marker + shared.chat.decode(ids[-limit:])
    if config.tool_response_truncate_side == "right":
        return shared.chat.decode(ids[:limit]) + marker
    head = limit // 2
    return (
        shared.chat.decode(ids[:head])
        + marker
        + shared.chat.decode(ids[len(ids) - (limit - head) :])
    )


def _tool_message(
    shared: RolloutShared, call_id: str | None, name: str | None, text: str
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "tool", "content": _cut_text(shared, text)}
    if call_id is not None:
        message["tool_call_id"] = call_id
    if name is not None:
        message["name"] = name
    return message
