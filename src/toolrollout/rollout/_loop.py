"""The per-trajectory run loop, split by phase.

One coroutine per (prompt, sample). Each turn: generate (engine, token-in/token-out) ->
parse tool calls -> run the turn's tools concurrently -> append the chat template's token
delta for the tool results. A final turn (no tool call) goes to the row's interaction, if
it has one, which may append a user message the same way (see ``_interactions.py``). The
transcript is only ever appended to: model tokens verbatim from the engine (loss mask 1,
engine logprobs), tool and interaction tokens as the template delta (loss mask 0, logprob
0.0). Nothing earlier is re-tokenized.

An aborted trajectory (the engine answered ``finish_reason`` ``abort``, or straggler
control stopped it before its next request) keeps every token and a :class:`ResumePoint`;
:func:`run_trajectory` given that point continues from exactly the same ids.
"""

from __future__ import annotations

import copy
import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import anyio

from toolrollout._exceptions import EngineError, OverlongPromptError, ToolRolloutError
from toolrollout._records import TokenSpan, Trajectory, TrajectoryStatus
from toolrollout.chat import ChatFormat, ImageRun, ToolCallParser, VisionFormat
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
from ._drift import drift_checkpoint, final_drift_check
from ._interactions import TrajectoryEnvironment, interaction_turn, select_interaction
from ._vision_turn import ImageLedger, attach_images, record_images

__all__ = ["ResumePoint", "RolloutPrompt", "StopControl", "run_trajectory"]


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
    drift_checkpoints: list[tuple[int, int, int]] = field(default_factory=list)
    """(transcript length, message count, model turns) after each tool/interaction delta."""
    drift_checked: set[int] = field(default_factory=set)
    drift_found: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Report of each checked checkpoint that did not match, by checkpoint index."""
    open_turn: bool = False
    """The last model turn was cut by an abort mid-generation; the next request continues it."""
    resumes: int = 0
    segments: list[tuple[int, int, str | None]] = field(default_factory=list)
    """(start, end, weight_version) of each engine answer within the response tokens."""
    prior_seconds: float = 0.0
    """Wall time spent before the last resume."""
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
    def drift_reports(self) -> list[dict[str, Any]]:
        return [self.drift_found[i] for i in sorted(self.drift_found)]

    @property
    def drift_mismatches(self) -> int:
        return len(self.drift_found)

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

    def resumed(self) -> _State:
        """A fresh copy to continue from; the frozen original can be resumed again."""
        return replace(
            self,
            messages=[dict(m) for m in self.messages],
            spans=list(self.spans),
            status=TrajectoryStatus.RUNNING,
            finish_reason=None,
            error=None,
            drift_checkpoints=list(self.drift_checkpoints),
            drift_checked=set(self.drift_checked),
            drift_found=dict(self.drift_found),
            resumes=self.resumes + 1,
            segments=list(self.segments),
            prior_seconds=self.prior_seconds + (time.perf_counter() - self.started),
            started=time.perf_counter(),
            tool_latency={k: list(v) for k, v in self.tool_latency.items()},
            tool_state=dict(self.tool_state),
            model_texts=list(self.model_texts),
            tool_records=list(self.tool_records),
            env=None,
            vision=copy.deepcopy(self.vision),
        )


@dataclass(frozen=True, slots=True)
class ResumePoint:
    """Where an aborted trajectory stopped, kept in memory on its :class:`Trajectory`.

    Holds the loop's own state at the abort (messages with the raw model text, the open
    turn, drift checkpoints, the interaction's rewards so far), which the public fields
    alone cannot rebuild exactly. Not written to parquet/JSONL.
    """

    prompt: RolloutPrompt
    _state: _State
    _env: dict[str, Any]


@dataclass(slots=True)
class StopControl:
    """Straggler control shared by one run's trajectories.

    Once ``stopping`` is set no trajectory sends another engine request (it ends
    ``aborted`` where it is), and the runner aborts the requests in ``inflight`` by rid.
    """

    stopping: bool = False
    inflight: dict[str, str] = field(default_factory=dict)
    """rid -> trajectory uid of every engine request being answered now."""


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
    stop: StopControl | None = None
    """Set by a run with a batch target (straggler control); None: run everything out."""


def _seed_for(config: RolloutConfig, state: _State) -> int | None:
    if config.seed is None:
        return None
    # Distinct, reproducible per (prompt, sample, turn); fits SGLang's int seed.
    key = (config.seed * 1_000_003 + state.prompt_index) * 1_009 + state.sample_index
    # A resumed turn draws fresh randomness instead of replaying its first leg's seed.
    return (key * 131 + state.num_turns + 7_919 * state.resumes) % (2**31 - 1)


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
    per_turn = sampling.max_new_tokens
    if state.open_turn:
        per_turn -= len(state.spans[-1].ids)  # the turn's first leg counts against its cap
        if per_turn <= 0:
            state.end(TrajectoryStatus.TRUNCATED, "length")
            return None
    max_new = min(per_turn, remaining)
    input_ids = state.transcript()
    if services.vision is not None and state.vision.urls:
        # One <|image_pad|> per image on the wire: every SGLang version expands that form
        # itself (see docs/multimodal.md); the transcript keeps the expanded ids.
        input_ids = services.vision.collapse(input_ids)
    rid = f"{state.uid}-t{state.num_turns}-{uuid.uuid4().hex[:8]}"
    request = GenerateRequest(
        input_ids=tuple(input_ids),
        sampling=_replace_sampling(sampling, max_new, _seed_for(config, state)),
        rid=rid,
        session_id=state.uid,
        image_data=tuple(state.vision.urls) or None,
    )
    state.status = TrajectoryStatus.RUNNING
    started = time.perf_counter()
    stop = services.stop
    async with services.engine_limiter:
        if stop is not None:
            if stop.stopping:  # the batch target is met: stop here, before the request
                state.end(TrajectoryStatus.ABORTED, "abort", _STOPPED)
                return None
            stop.inflight[rid] = state.uid
        try:
            result = await services.engine.generate(request)
        finally:
            if stop is not None:
                stop.inflight.pop(rid, None)
    state.generation_seconds += time.perf_counter() - started
    return result


_STOPPED = "stopped by straggler control: the batch target was met"


def _replace_sampling(sampling: Any, max_new_tokens: int, seed: int | None) -> Any:
    if seed is None:
        return replace(sampling, max_new_tokens=max_new_tokens)
    return replace(sampling, max_new_tokens=max_new_tokens, seed=seed)


def _append_model_turn(
    services: RolloutServices, state: _State, result: GenerateResult
) -> tuple[str, tuple[int, ...]]:
    """Phase 2: append the engine's ids verbatim; return the turn's text and ids.

    An open turn (cut by an abort, now resumed) is extended in place: its first leg's ids
    and logprobs stay as they were and the continuation follows them in the same span.
    """
    ids = tuple(result.output_ids)
    logprobs = result.output_logprobs
    if logprobs is None:
        raise EngineError("the engine returned no logprobs; token-exact rollouts need them")
    start = state.response_len
    span = TokenSpan("model", ids, tuple(float(x) for x in logprobs))
    if state.open_turn:
        first = state.spans.pop()
        span = TokenSpan("model", first.ids + span.ids, first.logprobs + span.logprobs)
        state.model_texts.pop()
    else:
        state.num_turns += 1
    state.open_turn = False
    state.spans.append(span)
    state.model_tokens += len(ids)
    state.cached_tokens += result.cached_tokens
    state.weight_version = result.weight_version
    state.segments.append((start, start + len(ids), result.weight_version))
    text = services.chat.model_text(span.ids)
    state.model_texts.append(text)
    return text, span.ids


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
    resume: ResumePoint | None = None,
) -> Trajectory:
    """Run one trajectory to a terminal state. Never raises for a trajectory-level fault.

    With ``resume`` (an aborted trajectory's :class:`ResumePoint`) it continues from the
    prompt plus the partial output, token for token: nothing is re-rendered.
    """
    if resume is not None:
        state = resume._state.resumed()
        prompt = resume.prompt
    else:
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
        if resume is not None:
            for name, value in resume._env.items():
                setattr(env, name, copy.copy(value))
        state.env = env
        try:
            await env.start(services.tools.tools.values(), _tool_context(state))
            await _drive(services, state, resumed=resume is not None)
        finally:
            # Every way out releases the tool instances and finalizes the interaction.
            await env.close(score=state.status in _SCORED)
    except OverlongPromptError as exc:
        state.end(TrajectoryStatus.FAILED, "overlong_prompt", f"{type(exc).__name__}: {exc}")
    except ToolRolloutError as exc:
        state.end(TrajectoryStatus.FAILED, "error", f"{type(exc).__name__}: {exc}")
    if services.config.drift_check:
        final_drift_check(services, state)
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


_ENV_CARRIED = (
    "turn_rewards",
    "tool_rewards",
    "interaction_turns",
    "appended_turns",
    "interaction_tokens",
    "interaction_metrics",
    "errors",
)
"""What a resumed trajectory keeps of its interaction's bookkeeping (new instances start)."""


_SCORED = (TrajectoryStatus.COMPLETED, TrajectoryStatus.TRUNCATED)


async def _drive(services: RolloutServices, state: _State, *, resumed: bool = False) -> None:
    config = services.config
    chat = services.chat
    if not resumed:
        state.prompt_ids = chat.render_prompt(state.messages)
    if services.context_length is not None and len(state.prompt_ids) >= services.context_length:
        raise OverlongPromptError(
            f"prompt has {len(state.prompt_ids)} tokens; the context is {services.context_length}",
            status_code=400,
        )
    state.status = TrajectoryStatus.RUNNING
    while True:
        if state.num_turns >= config.max_turns and not state.open_turn:
            state.end(TrajectoryStatus.TRUNCATED, "max_turns")
            return
        continuing = state.open_turn
        result = await _generate(services, state)
        if result is None:
            return
        finish = result.finish_reason.type
        if finish == "abort" and not result.output_ids:
            # Aborted before a token came: nothing to append, the open turn stays open.
            state.end(TrajectoryStatus.ABORTED, "abort", result.finish_reason.message)
            return
        text, turn_ids = _append_model_turn(services, state, result)
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
        if continuing:
            state.messages[-1] = assistant  # the open turn's message, now with all its text
        else:
            state.messages.append(assistant)
        if finish == "abort":
            state.open_turn = True
            state.end(TrajectoryStatus.ABORTED, "abort", result.finish_reason.message)
            return
        if finish == "length":
            # A cut-off turn is never followed by another one (no "ghost turns").
            state.end(TrajectoryStatus.TRUNCATED, "length")
            return
        state.parse_errors += len(parsed.errors)
        if not parsed.tool_calls and not parsed.errors:
            if state.env is not None and state.env.interaction is not None:
                if await interaction_turn(services, state, turn_ids):
                    continue
                return
            state.end(TrajectoryStatus.COMPLETED, "stop")
            return
        if state.num_turns >= config.max_turns:
            # The model asked for tools but has no turn left to read their results.
            state.end(TrajectoryStatus.TRUNCATED, "max_turns")
            return
        if not chat.ends_with_stop(turn_ids):
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
        drift_checkpoint(services, state)


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
        "total_seconds": round(state.prior_seconds + time.perf_counter() - state.started, 6),
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
    if state.resumes:
        # Which weights sampled which tokens: [start, end, version] per engine answer,
        # positions in the response tokens (a resume may cross a weight update).
        metrics["resumes"] = state.resumes
        metrics["weight_versions"] = [list(segment) for segment in state.segments]
    if details:
        metrics["reward_terms"] = details
    env = state.env
    if env is not None:
        metrics.update(env.metrics())
    resume = None
    if state.status is TrajectoryStatus.ABORTED:
        carried = {} if env is None else {name: getattr(env, name) for name in _ENV_CARRIED}
        # Without the live environment (closed by now), so the point pickles (Ray, queues).
        resume = ResumePoint(state.prompt, replace(state, env=None), carried)
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
        resume_point=resume,
    )


def _data_source(metadata: dict[str, Any]) -> str | None:
    source = metadata.get("data_source")
    return None if source is None else str(source)
