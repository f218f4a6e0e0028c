"""The per-trajectory run loop, split by phase.

One coroutine per (prompt, sample). Each turn: generate (engine, token-in/token-out) ->
parse tool calls -> run the turn's tools concurrently -> append the chat template's token
delta for the tool results. A final turn (no tool call) goes to the row's interaction, if
it has one, which may append a user message the same way (see ``_interactions.py``). The
transcript is only ever appended to: model tokens verbatim from the engine (loss mask 1,
engine logprobs), tool and interaction tokens as the template delta (loss mask 0, logprob
0.0). Nothing earlier is re-tokenized.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from toolrollout._exceptions import EngineError, OverlongPromptError, ToolRolloutError
from toolrollout.chat import ChatFormat, ImageRun, ToolCallParser, VisionFormat, check_drift
from toolrollout.engines._base import Engine
from toolrollout.engines._types import GenerateRequest, GenerateResult
from toolrollout.rewards import WeightedReward, evaluate_terms
from toolrollout.tools import (
    ToolCallRequest,
    ToolContext,
    ToolExecutor,
    ToolResult,
    summarize_tool_calls,
)

from ._config import RolloutConfig
from ._interactions import TrajectoryEnvironment, interaction_turn, select_interaction
from ._trajectory import TokenSpan, Trajectory, TrajectoryStatus
from ._vision_turn import ImageLedger, attach_images, record_images

__all__ = ["RolloutPrompt", "run_trajectory"]


@dataclass(frozen=True, slots=True)
class RolloutPrompt:
    """One dataset row: the opening messages and, optionally, the ground truth."""

    messages: tuple[dict[str, Any], ...]
    ground_truth: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class _State:
    """Mutable state of one running trajectory (frozen into a Trajectory at the end)."""

    uid: str
    group_id: str
    prompt_index: int
    sample_index: int
    prompt: RolloutPrompt
    messages: list[dict[str, Any]]
    prompt_ids: list[int] = field(default_factory=list)
    spans: list[TokenSpan] = field(default_factory=list)
    status: TrajectoryStatus = TrajectoryStatus.PENDING
    finish_reason: str | None = None
    error: str | None = None
    num_turns: int = 0
    num_tool_calls: int = 0
    tool_errors: int = 0
    parse_errors: int = 0
    weight_version: str | None = None
    drift_mismatches: int = 0
    drift_reports: list[dict[str, Any]] = field(default_factory=list)
    generation_seconds: float = 0.0
    tool_seconds: float = 0.0
    started: float = field(default_factory=time.perf_counter)
    tool_latency: dict[str, list[float]] = field(default_factory=dict)
    model_tokens: int = 0
    tool_tokens: int = 0
    cached_tokens: int = 0
    tool_state: dict[str, Any] = field(default_factory=dict)
    model_texts: list[str] = field(default_factory=list)
    tool_records: list[tuple[str, ToolResult]] = field(default_factory=list)
    env: TrajectoryEnvironment | None = None
    vision: ImageLedger = field(default_factory=ImageLedger)

    @property
    def response_len(self) -> int:
        return sum(len(s.ids) for s in self.spans)

    def transcript(self) -> list[int]:
        out = list(self.prompt_ids)
        for span in self.spans:
            out.extend(span.ids)
        return out

    def end(self, status: TrajectoryStatus, reason: str, error: str | None = None) -> None:
        self.status = status
        self.finish_reason = reason
        if error is not None:
            self.error = error


@dataclass(slots=True)
class RolloutServices:
    """What a trajectory needs from its surroundings, shared by all trajectories of a run."""

    engine: Engine
    chat: ChatFormat
    parser: ToolCallParser
    tools: ToolExecutor
    config: RolloutConfig
    rewards: Sequence[WeightedReward]
    engine_limiter: anyio.CapacityLimiter
    context_length: int | None
    interactions: Mapping[str, Any] = field(default_factory=dict)
    """Interaction objects by name; each row picks one by ``interaction_kwargs.name``."""
    vision: VisionFormat | None = None
    """Placeholder expansion for a vision-language model; None for text models."""


def _seed_for(config: RolloutConfig, state: _State) -> int | None:
    if config.seed is None:
        return None
    # Distinct, reproducible per (prompt, sample, turn); fits SGLang's int seed.
    key = (config.seed * 1_000_003 + state.prompt_index) * 1_009 + state.sample_index
    return (key * 131 + state.num_turns) % (2**31 - 1)


async def _generate(services: RolloutServices, state: _State) -> GenerateResult | None:
    """Phase 1: one model turn. Returns None when a budget ends the trajectory first."""
    config = services.config
    used = state.response_len
    remaining = config.max_response_tokens - used
    if services.context_length is not None:
        remaining = min(remaining, services.context_length - len(state.prompt_ids) - used)
    if remaining <= 0:
        state.end(TrajectoryStatus.TRUNCATED, "max_response_tokens")
        return None
    sampling = config.sampling
    max_new = min(sampling.max_new_tokens, remaining)
    input_ids = state.transcript()
    if services.vision is not None and state.vision.urls:
        # One <|image_pad|> per image on the wire: every SGLang version expands that form
        # itself (see docs/multimodal.md); the transcript keeps the expanded ids.
        input_ids = services.vision.collapse(input_ids)
    request = GenerateRequest(
        input_ids=tuple(input_ids),
        sampling=_replace_sampling(sampling, max_new, _seed_for(config, state)),
        rid=f"{state.uid}-t{state.num_turns}-{uuid.uuid4().hex[:8]}",
        session_id=state.uid,
        image_data=tuple(state.vision.urls) or None,
    )
    state.status = TrajectoryStatus.RUNNING
    started = time.perf_counter()
    async with services.engine_limiter:
        result = await services.engine.generate(request)
    state.generation_seconds += time.perf_counter() - started
    return result


def _replace_sampling(sampling: Any, max_new_tokens: int, seed: int | None) -> Any:
    from dataclasses import replace

    if seed is None:
        return replace(sampling, max_new_tokens=max_new_tokens)
    return replace(sampling, max_new_tokens=max_new_tokens, seed=seed)


def _append_model_turn(services: RolloutServices, state: _State, result: GenerateResult) -> str:
    """Phase 2: append the engine's ids verbatim and return the decoded text."""
    ids = result.output_ids
    logprobs = result.output_logprobs
    if logprobs is None:
        raise EngineError("the engine returned no logprobs; token-exact rollouts need them")
    state.spans.append(TokenSpan("model", tuple(ids), tuple(float(x) for x in logprobs)))
    state.num_turns += 1
    state.model_tokens += len(ids)
    state.cached_tokens += result.cached_tokens
    state.weight_version = result.weight_version
    text = services.chat.model_text(ids)
    state.model_texts.append(text)
    return text


def _cut_text(services: RolloutServices, text: str) -> str:
    """Bound one tool result to ``max_tool_response_tokens`` on the configured side."""
    config = services.config
    limit = config.max_tool_response_tokens
    ids = services.chat.encode(text)
    if len(ids) <= limit:
        return text
    marker = "...(truncated)"
    if config.tool_response_truncate_side == "left":
        return marker + services.chat.decode(ids[-limit:])
    if config.tool_response_truncate_side == "right":
        return services.chat.decode(ids[:limit]) + marker
    head = limit // 2
    return (
        services.chat.decode(ids[:head])
        + marker
        + services.chat.decode(ids[len(ids) - (limit - head) :])
    )


async def _run_tools(
    services: RolloutServices, state: _State, calls: Sequence[ToolCallRequest]
) -> list[ToolResult]:
    """Phase 3: the turn's tool calls, concurrently, results in call order."""
    state.status = TrajectoryStatus.TOOL_CALLING
    started = time.perf_counter()
    results = await services.tools.run_calls(calls, _tool_context(state))
    state.tool_seconds += time.perf_counter() - started
    if state.env is not None:
        state.env.record_tool_results(state.num_turns, results)
    for call, result in zip(calls, results, strict=True):
        state.tool_latency.setdefault(call.name, []).append(result.seconds)
        state.tool_records.append((call.name, result))
        if result.is_error:
            state.tool_errors += 1
    return results


def _tool_context(state: _State) -> ToolContext:
    return ToolContext(
        trajectory_id=state.uid,
        sample_index=state.sample_index,
        metadata=state.prompt.metadata,
        ground_truth=state.prompt.ground_truth,
        state=state.tool_state,
        session=None if state.env is None else state.env.tools,
    )


async def run_trajectory(
    services: RolloutServices,
    prompt: RolloutPrompt,
    *,
    prompt_index: int,
    sample_index: int,
    group_id: str,
) -> Trajectory:
    """Run one trajectory to a terminal state. Never raises for a trajectory-level fault."""
    state = _State(
        uid=f"{group_id}-{sample_index}",
        group_id=group_id,
        prompt_index=prompt_index,
        sample_index=sample_index,
        prompt=prompt,
        messages=[dict(m) for m in prompt.messages],
    )
    try:
        interaction, interaction_kwargs = select_interaction(services.interactions, prompt)
        env = TrajectoryEnvironment(
            state.uid,
            prompt,
            interaction,
            interaction_kwargs,
            timeout=services.config.interaction_timeout,
        )
        state.env = env
        try:
            await env.start(services.tools.tools.values(), _tool_context(state))
            await _drive(services, state)
        finally:
            # Every way out releases the tool instances and finalizes the interaction.
            await env.close(score=state.status in _SCORED)
    except OverlongPromptError as exc:
        state.end(TrajectoryStatus.FAILED, "overlong_prompt", f"{type(exc).__name__}: {exc}")
    except ToolRolloutError as exc:
        state.end(TrajectoryStatus.FAILED, "error", f"{type(exc).__name__}: {exc}")
    reward: float | None = None
    details: dict[str, float] = {}
    trajectory = _freeze(state, reward, details)
    if state.status in _SCORED:
        outcome: float | None = None
        try:
            if services.rewards:
                outcome, details = await evaluate_terms(services.rewards, trajectory)
        except Exception as exc:  # a broken reward marks the row, never a silent 0
            state.end(TrajectoryStatus.FAILED, "reward_error", f"{type(exc).__name__}: {exc}")
            details = {}
        else:
            reward, terms = services.config.reward_mix.combine(
                outcome,
                trajectory.turn_rewards,
                trajectory.tool_rewards,
                trajectory.tool_final_rewards,
            )
            details = {**details, **terms}
        trajectory = _freeze(state, reward, details)
    return trajectory


_SCORED = (TrajectoryStatus.COMPLETED, TrajectoryStatus.TRUNCATED)


async def _drive(services: RolloutServices, state: _State) -> None:
    config = services.config
    chat = services.chat
    state.prompt_ids = chat.render_prompt(state.messages)
    if services.context_length is not None and len(state.prompt_ids) >= services.context_length:
        raise OverlongPromptError(
            f"prompt has {len(state.prompt_ids)} tokens; the context is {services.context_length}",
            status_code=400,
        )
    state.status = TrajectoryStatus.RUNNING
    while True:
        if state.num_turns >= config.max_turns:
            state.end(TrajectoryStatus.TRUNCATED, "max_turns")
            return
        result = await _generate(services, state)
        if result is None:
            return
        text = _append_model_turn(services, state, result)
        finish = result.finish_reason.type
        parsed = services.parser.parse(text)
        assistant: dict[str, Any] = {"role": "assistant", "content": parsed.content}
        if parsed.errors:
            # A malformed call cannot be rendered from structured tool_calls: keep what the
            # model wrote, so the messages still render to the tokens it was trained on.
            assistant["content"] = text
        elif parsed.tool_calls:
            assistant["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call in parsed.tool_calls
            ]
        assistant["raw_content"] = text
        state.messages.append(assistant)
        if finish == "abort":
            state.end(TrajectoryStatus.ABORTED, "abort", result.finish_reason.message)
            return
        if finish == "length":
            # A cut-off turn is never followed by another one (no "ghost turns").
            state.end(TrajectoryStatus.TRUNCATED, "length")
            return
        state.parse_errors += len(parsed.errors)
        if not parsed.tool_calls and not parsed.errors:
            if state.env is not None and state.env.interaction is not None:
                if await interaction_turn(services, state, result.output_ids):
                    continue
                return
            state.end(TrajectoryStatus.COMPLETED, "stop")
            return
        if state.num_turns >= config.max_turns:
            # The model asked for tools but has no turn left to read their results.
            state.end(TrajectoryStatus.TRUNCATED, "max_turns")
            return
        if not chat.ends_with_stop(result.output_ids):
            # Stopped by a stop string: there is no template boundary to extend from.
            state.end(TrajectoryStatus.TRUNCATED, "stop_string")
            return
        requests = [
            ToolCallRequest(id=c.id, name=c.name, arguments=c.arguments) for c in parsed.tool_calls
        ]
        over_turn = requests[config.max_tool_calls_per_turn :]
        requests = requests[: config.max_tool_calls_per_turn]
        room = max(config.max_tool_calls - state.num_tool_calls, 0)
        over_total = requests[room:]
        requests = requests[:room]
        results = await _run_tools(services, state, requests)
        state.num_tool_calls += len(requests)
        tool_messages: list[dict[str, Any]] = []
        for request, tool_result in zip(requests, results, strict=True):
            tool_messages.append(
                _tool_message(services, request.id, request.name, tool_result.text)
            )
        for request in [*over_turn, *over_total]:
            state.tool_errors += 1
            tool_messages.append(
                _tool_message(
                    services,
                    request.id,
                    request.name,
                    f"Error: tool call limit reached; '{request.name}' was not run.",
                )
            )
        tool_messages.extend(
            _tool_message(services, None, None, f"Error: could not parse tool call: {e.message}")
            for e in parsed.errors
        )
        images, image_errors = await attach_images(
            services.vision, config, state.vision, results, tool_messages
        )
        state.tool_errors += image_errors
        delta = chat.tool_turn_delta(state.messages, tool_messages)
        runs: list[ImageRun] = []
        if services.vision is not None:
            delta, runs = services.vision.expand(delta, [image.num_tokens for image in images])
        budget = config.max_response_tokens - state.response_len
        if services.context_length is not None:
            budget = min(
                budget, services.context_length - len(state.prompt_ids) - state.response_len
            )
        if len(delta) >= budget:
            state.end(TrajectoryStatus.TRUNCATED, "max_response_tokens")
            return
        state.messages.extend(tool_messages)
        record_images(state.vision, images, runs, len(state.prompt_ids) + state.response_len)
        state.spans.append(TokenSpan("tool", tuple(delta), (0.0,) * len(delta)))
        state.tool_tokens += len(delta)
        if config.drift_check:
            transcript = state.transcript()
            if services.vision is not None:
                transcript = services.vision.collapse(transcript)
            report = check_drift(
                transcript,
                state.messages,
                chat_format=chat,
                model_texts=state.model_texts,
            )
            if not report.matches:
                state.drift_mismatches += 1
                state.drift_reports.append(report.to_dict())


def _tool_message(
    services: RolloutServices, call_id: str | None, name: str | None, text: str
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "tool", "content": _cut_text(services, text)}
    if call_id is not None:
        message["tool_call_id"] = call_id
    if name is not None:
        message["name"] = name
    return message


def _public_messages(messages: list[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    out = []
    for message in messages:
        clean = {k: v for k, v in message.items() if k != "raw_content"}
        if "tool_calls" in clean:
            clean["tool_calls"] = [
                {
                    **call,
                    "function": {
                        "name": call["function"]["name"],
                        "arguments": json.dumps(call["function"]["arguments"], ensure_ascii=False),
                    },
                }
                for call in clean["tool_calls"]
            ]
        out.append(clean)
    return tuple(out)


def _freeze(state: _State, reward: float | None, details: dict[str, float]) -> Trajectory:
    metrics: dict[str, Any] = {
        "generation_seconds": round(state.generation_seconds, 6),
        "tool_seconds": round(state.tool_seconds, 6),
        "total_seconds": round(time.perf_counter() - state.started, 6),
        "tool_latency": {k: [round(x, 6) for x in v] for k, v in state.tool_latency.items()},
        "drift_mismatches": state.drift_mismatches,
        "model_tokens": state.model_tokens,
        "tool_tokens": state.tool_tokens,
        "cached_tokens": state.cached_tokens,
    }
    if state.vision.images or state.vision.dropped:
        metrics["images"] = len(state.vision.images)
        metrics["image_tokens"] = state.vision.tokens
        metrics["images_dropped"] = state.vision.dropped
    if state.tool_records:
        metrics["tool_stats"] = {
            name: summary.to_dict()
            for name, summary in summarize_tool_calls(state.tool_records).items()
        }
    if state.drift_reports:
        metrics["drift_reports"] = state.drift_reports
    if details:
        metrics["reward_terms"] = details
    env = state.env
    if env is not None:
        metrics.update(env.metrics())
    return Trajectory(
        uid=state.uid,
        group_id=state.group_id,
        prompt_index=state.prompt_index,
        sample_index=state.sample_index,
        prompt_ids=tuple(state.prompt_ids),
        spans=tuple(state.spans),
        messages=_public_messages(state.messages),
        status=state.status,
        finish_reason=state.finish_reason,
        error=state.error,
        reward=reward,
        reward_details=details,
        num_turns=state.num_turns,
        num_tool_calls=state.num_tool_calls,
        tool_errors=state.tool_errors,
        parse_errors=state.parse_errors,
        weight_version=state.weight_version,
        metrics=metrics,
        ground_truth=state.prompt.ground_truth,
        turn_rewards=() if env is None else env.per_turn(env.turn_rewards, state.num_turns),
        tool_rewards=() if env is None else env.per_turn(env.tool_rewards, state.num_turns),
        tool_final_rewards={} if env is None else dict(env.tool_final_rewards),
        images=tuple(state.vision.images),
        data_source=_data_source(state.prompt.metadata),
    )


def _data_source(metadata: dict[str, Any]) -> str | None:
    source = metadata.get("data_source")
    return None if source is None else str(source)
