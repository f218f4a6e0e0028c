"""The per-trajectory driver: one coroutine per (prompt, sample).

Each turn generates, appends the model turn, lets the environment answer and appends the
chat template's token delta for that answer; nothing earlier is re-tokenized
(docs/rollouts.md, The transcript). :func:`run_trajectory` is final: the order of the
phases is the contract the token invariants rest on (custom environments override
:class:`TrajectoryHooks`). An aborted trajectory keeps every token and a
:class:`ResumePoint`, from which :func:`run_trajectory` continues with the same ids.
"""

from __future__ import annotations

import time
import uuid
from array import array
from contextlib import AbstractAsyncContextManager
from dataclasses import replace

import anyio

from toolrollout._exceptions import OverlongPromptError, ToolRolloutError
from toolrollout._pacing import pace, set_pace_key
from toolrollout._records import ResumePoint, RolloutPrompt, Trajectory, TrajectoryStatus
from toolrollout.engines._types import GenerateRequest, GenerateResult, SamplingParams, TokenRuns

from ._environment import TrajectoryEnvironment
from ._hooks import TrajectoryHooks
from ._interactions import select_interaction
from ._state import TrajectoryState
from ._types import ModelTurn, RolloutShared, render_prompt

__all__ = ["run_trajectory"]

_STOPPED = "stopped by straggler control: the batch target was met"


async def run_trajectory(
    shared: RolloutShared,
    prompt: RolloutPrompt,
    place: tuple[str, int, int],
    resume: ResumePoint | None,
    hooks: TrajectoryHooks,
) -> Trajectory:
    """Run one trajectory (``place``: group id, prompt index, sample index) to a terminal
    state. Never raises for a trajectory-level fault. With ``resume`` it continues from
    the prompt plus the partial output, token for token. Final: customise through ``hooks``.
    """
    if resume is not None:
        state = TrajectoryState.resumed_from(shared, resume)
    else:
        group_id, prompt_index, sample_index = place
        state = TrajectoryState(
            shared, prompt, prompt_index=prompt_index, sample_index=sample_index,
            group_id=group_id,
        )  # fmt: skip
    scheduler = shared.scheduler
    if scheduler is not None and scheduler.config.oldest:
        set_pace_key(scheduler.group_rank(state))  # a busy loop serves older groups first
    # Trajectories started together render their prompts one loop iteration after another.
    await pace()
    try:
        interaction, kwargs = select_interaction(shared.interactions, state.prompt)
        env = TrajectoryEnvironment(
            state.uid, state.prompt.metadata, state.environment, interaction, kwargs,
            timeout=shared.config.interaction_timeout,
        )  # fmt: skip
        try:
            await env.start(shared.tools.tools.values(), state.tool_context(env.tools))
            await _drive(state, hooks, env, resumed=resume is not None)
        finally:
            # Every way out releases the tool instances and finalizes the interaction.
            await env.close(score=state.scored)
    except OverlongPromptError as exc:  # the engine's 4xx: the prompt does not fit
        state.finish(TrajectoryStatus.FAILED, "overlong_prompt", f"{type(exc).__name__}: {exc}")
    except ToolRolloutError as exc:
        state.finish(TrajectoryStatus.FAILED, "error", f"{type(exc).__name__}: {exc}")
    if shared.config.drift_check:
        await _final_drift_check(state)
    if scheduler is not None:
        scheduler.finished(state)
    await pace()  # freezing, scoring and the caller's callback: one more piece of work
    trajectory = state.freeze()
    if not state.scored:
        return trajectory
    try:
        reward, details = await hooks.score(state, trajectory)
    except Exception as exc:  # a broken reward marks the row, never a silent 0
        error = f"{type(exc).__name__}: {exc}"
        return replace(trajectory, status=TrajectoryStatus.FAILED, finish_reason="reward_error",
                       error=error)  # fmt: skip
    metrics = {**trajectory.metrics, "reward_terms": details} if details else trajectory.metrics
    return replace(trajectory, reward=reward, reward_details=details, metrics=metrics)


async def _final_drift_check(state: TrajectoryState) -> None:
    """The drift check at the end of a trajectory: on the run's one worker thread when the
    tokenizer's Rust encoder lets go of the GIL, else on the loop (why: docs/rollouts.md,
    Drift check)."""
    limiter = state.shared.drift_limiter
    if limiter is not None and state.shared.chat.encodes_without_the_gil:
        # The view (a joined copy of the ids, the decoded model texts) is made on the
        # thread: made before, it would wait in the queue for the thread, in memory.
        await anyio.to_thread.run_sync(_check_drift_now, state, limiter=limiter)
    else:
        _check_drift_now(state)


def _check_drift_now(state: TrajectoryState) -> None:
    state.drift.final_check(state.drift_view())


async def _drive(
    state: TrajectoryState, hooks: TrajectoryHooks, env: TrajectoryEnvironment, *, resumed: bool
) -> None:
    """The turns: stop? -> generate -> model turn -> environment step -> its delta."""
    context = state.shared.context_length
    if not resumed:
        state.transcript.prompt_ids = render_prompt(state.shared, state.transcript.messages)
    prompt_len = len(state.transcript.prompt_ids)
    if context is not None and prompt_len >= context:
        # Checked here, before any request: a local budget, not an answer of the engine.
        error = (
            f"LocalContextBudget: prompt has {prompt_len} tokens; the context is {context} "
            "(checked before sending, no engine request was made)"
        )
        state.finish(TrajectoryStatus.FAILED, "overlong_prompt", error)
        return
    state.status = TrajectoryStatus.RUNNING
    pending = state.pending_model_turn() if resumed else None
    if pending is not None and not await _answer(state, hooks, env, pending):
        return  # stopped during its tool calls before, answered first now
    while True:
        reason = hooks.should_stop(state)
        if reason is not None:
            state.finish(TrajectoryStatus.TRUNCATED, reason)
            return
        result = await _generate(state)
        if result is None:
            return
        if result.finish_reason.type == "abort" and not result.output_ids:
            # Aborted before a token came: nothing to append, the open turn stays open.
            state.finish(TrajectoryStatus.ABORTED, "abort", result.finish_reason.message)
            return
        turn = state.append_model_turn(result)
        await hooks.on_model_turn(state, turn)
        if state.finished or not await _answer(state, hooks, env, turn):
            return


async def _answer(
    state: TrajectoryState, hooks: TrajectoryHooks, env: TrajectoryEnvironment, turn: ModelTurn
) -> bool:
    """The environment's answer to a model turn, appended; False when the trajectory ends."""
    step = await hooks.env_step(state, turn, env)
    if step is None:
        if not state.finished:
            state.finish(TrajectoryStatus.COMPLETED, "stop")
        return False
    return state.append_env_turn(step)


async def _generate(state: TrajectoryState) -> GenerateResult | None:
    """One engine request. None when a budget (or straggler control) ends it first."""
    shared, transcript = state.shared, state.transcript
    remaining = state.remaining_budget()
    if remaining <= 0:
        state.finish(TrajectoryStatus.TRUNCATED, "max_response_tokens")
        return None
    sampling = shared.config.sampling
    per_turn = sampling.max_new_tokens
    if transcript.open_turn:
        per_turn -= transcript.spans[-1].num_tokens  # the turn's first leg counts against its cap
        if per_turn <= 0:
            state.finish(TrajectoryStatus.TRUNCATED, "length")
            return None
    rid = f"{state.uid}-t{state.num_turns}-{uuid.uuid4().hex[:8]}"
    request = GenerateRequest(
        input_ids=_request_ids(state),
        sampling=_sampling(sampling, min(per_turn, remaining), _seed_for(state)),
        rid=rid,
        session_id=state.uid,
        image_data=tuple(state.vision.urls) or None,
    )
    slot: AbstractAsyncContextManager[None] = shared.engine_limiter
    if shared.scheduler is not None:  # issue 20: client-side scheduling policies
        request = await shared.scheduler.prepare(request, state, shared.engine_limiter)
        slot = shared.scheduler.slot(state, shared.engine_limiter)  # ``oldest``: in order
    state.status = TrajectoryStatus.RUNNING
    started = time.perf_counter()
    stop = shared.stop
    async with slot:
        if stop is not None:
            if stop.stopping:  # the batch target is met: stop here, before the request
                state.finish(TrajectoryStatus.ABORTED, "abort", _STOPPED)
                return None
            stop.inflight[rid] = state.uid
        try:
            result = await shared.engine.generate(request)
        finally:
            if stop is not None:
                stop.inflight.pop(rid, None)
    state.timing.generation_seconds += time.perf_counter() - started
    return result


def _request_ids(state: TrajectoryState) -> TokenRuns | array[int]:
    """The ids a request carries while it waits for the engine: the transcript's own arrays
    (:class:`TokenRuns`, no copy of the conversation), or for images a collapsed copy."""
    vision = state.shared.vision
    if vision is not None and state.vision.urls:
        # One <|image_pad|> per image on the wire: every SGLang version expands that form
        # itself (see docs/multimodal.md); the transcript keeps the expanded ids.
        return array("i", vision.collapse(state.transcript.ids()))
    return state.transcript.runs()


def _seed_for(state: TrajectoryState) -> int | None:
    seed = state.shared.config.seed
    if seed is None:
        return None
    # Distinct, reproducible per (run of the runner, prompt, sample, turn), in SGLang's int
    # range; a later run scrambles the base seed, so runs do not line up position by position.
    if state.shared.seed_round:
        seed = (seed * 2_654_435_761 + state.shared.seed_round * 40_503) % (2**31 - 1)
    key = (seed * 1_000_003 + state.prompt_index) * 1_009 + state.sample_index
    # A resumed turn draws fresh randomness instead of replaying its first leg's seed.
    return (key * 131 + state.num_turns + 7_919 * state.counters.resumes) % (2**31 - 1)


def _sampling(sampling: SamplingParams, max_new_tokens: int, seed: int | None) -> SamplingParams:
    if seed is None:
        return replace(sampling, max_new_tokens=max_new_tokens)
    return replace(sampling, max_new_tokens=max_new_tokens, seed=seed)
