"""The state of one running trajectory: its rules, its freezing, its resume point.

:class:`TrajectoryState` is the only thing the loop, the environment steps and the drift
check change while a trajectory runs. Its fields are small records (:mod:`._types`); its
methods are the rules that touch several at once: the one budget rule, appending model and
environment turns, ending, freezing into a :class:`Trajectory` and saving or rebuilding a
resume point (its schema: :mod:`._resume_payload`).
"""

from __future__ import annotations

import dataclasses
from array import array
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from toolrollout._exceptions import EngineError, ToolRolloutError
from toolrollout._records import (
    ResumePoint,
    TokenSpan,
    Trajectory,
    TrajectoryStatus,
)
from toolrollout.chat import ParsedTurn
from toolrollout.chat._multimodal import ImageRun
from toolrollout.engines._types import GenerateResult
from toolrollout.tools import (
    ToolContext,
    ToolResult,
    ToolSession,
)
from toolrollout.tools._summary import summarize_call_records

from ._drift import DriftLedger, DriftView
from ._environment import EnvironmentLedger
from ._model_turn import parse_model_turn
from ._resume_payload import read_payload, resume_point_of
from ._types import (
    Counters,
    EnvStep,
    ModelTurn,
    RolloutPrompt,
    RolloutShared,
    Timing,
    ToolLedger,
    Transcript,
    id_tuple,
)
from ._vision_turn import ImageLedger, record_images

if TYPE_CHECKING:
    from ._config import RolloutConfig

__all__ = ["TrajectoryState", "public_messages", "sampling_record"]


class TrajectoryState:
    """One running trajectory. Mutated by its own task only; frozen once at the end."""

    __slots__ = (
        "counters",
        "drift",
        "engine_moves",
        "environment",
        "error",
        "finish_reason",
        "group_id",
        "prompt",
        "prompt_index",
        "sample_index",
        "server",
        "shared",
        "status",
        "timing",
        "tools",
        "transcript",
        "uid",
        "vision",
    )

    def __init__(
        self,
        shared: RolloutShared,
        prompt: RolloutPrompt,
        *,
        prompt_index: int,
        sample_index: int,
        group_id: str,
        uid: str | None = None,
    ) -> None:
        self.shared = shared
        self.prompt = prompt
        self.prompt_index = prompt_index
        self.sample_index = sample_index
        self.group_id = group_id
        self.uid = f"{group_id}-{sample_index}" if uid is None else uid
        self.status = TrajectoryStatus.PENDING
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.transcript = Transcript([dict(m) for m in prompt.messages])
        self.counters = Counters()
        self.timing = Timing()
        self.tools = ToolLedger()
        self.drift = DriftLedger()
        self.vision = ImageLedger()
        self.environment = EnvironmentLedger()
        self.server: str | None = None
        """The server that answered the last turn (failover moves are seen against it)."""
        self.engine_moves: list[dict[str, Any]] = []

    # --- reading -----------------------------------------------------------------------

    @property
    def num_turns(self) -> int:
        return self.counters.num_turns

    @property
    def finished(self) -> bool:
        return self.status.is_terminal

    @property
    def scored(self) -> bool:
        """Completed or truncated: its reward functions and tool rewards run."""
        return self.status in (TrajectoryStatus.COMPLETED, TrajectoryStatus.TRUNCATED)

    def remaining_budget(self) -> int:
        """Response tokens still allowed: ``max_response_tokens`` and the context, the one
        budget rule for model turns and environment deltas alike."""
        used = self.transcript.response_len
        remaining = self.shared.config.max_response_tokens - used
        context = self.shared.context_length
        if context is not None:
            remaining = min(remaining, context - len(self.transcript.prompt_ids) - used)
        return remaining

    def tool_context(self, session: ToolSession | None) -> ToolContext:
        return ToolContext(
            trajectory_id=self.uid,
            sample_index=self.sample_index,
            metadata=self.prompt.metadata,
            ground_truth=self.prompt.ground_truth,
            state=self.tools.state,
            session=session,
        )

    # --- changing ----------------------------------------------------------------------

    def finish(self, status: TrajectoryStatus, reason: str, error: str | None = None) -> None:
        """End the trajectory (the last word wins: a reward error fails a completed one)."""
        self.status = status
        self.finish_reason = reason
        if error is not None:
            self.error = error

    def append_model_turn(
        self,
        result: GenerateResult,
        *,
        forced: Sequence[int] = (),
        parsed: tuple[str, ParsedTurn] | None = None,
    ) -> ModelTurn:
        """Append the engine's ids verbatim (loss mask 1, its logprobs) and the assistant
        message parsed from them; end the trajectory if the engine cut the turn. An open
        turn (resumed after an abort) is continued in the same span.

        ``forced``: ids put before the model's own (the gateway's ``tool_choice``), a span
        of loss mask 0 that starts the turn's text. ``parsed``: the turn's (text, parse)
        when the caller (the gateway) parsed it already with :func:`parse_model_turn`.
        """
        ids = result.output_ids
        logprobs = result.output_logprobs
        if logprobs is None:
            raise EngineError("the engine returned no logprobs; token-exact rollouts need them")
        t, c = self.transcript, self.counters
        self._note_server(result.server_url)
        if forced:
            t.forced = (*t.forced, len(t.spans))
            t.spans.append(TokenSpan("interaction", forced, None))
        start = t.response_len
        continuing = t.open_turn
        span = TokenSpan("model", ids, logprobs)
        if continuing:
            first = t.spans.pop()
            span = _joined(first, span)
        else:
            c.num_turns += 1
        t.open_turn = False
        t.spans.append(span)
        c.model_tokens += len(ids)
        c.cached_tokens += result.cached_tokens
        c.weight_version = result.weight_version
        if result.weight_spans:  # the server says which weights sampled which tokens
            t.segments.extend((start + a, start + b, v) for a, b, v in result.weight_spans)
        else:
            t.segments.append((start, start + len(ids), result.weight_version))
        turn_ids = span.ids if continuing else tuple(ids)
        text, turn = self._parse_model_turn(turn_ids) if parsed is None else parsed
        family = self.shared.chat.family
        message = family.build_assistant_message(text, turn, [call.id for call in turn.tool_calls])
        # The raw text is the decode of the span's ids, derived again when needed.
        message.pop("raw_content", None)
        if continuing:
            t.messages[-1] = message  # the open turn's message, now with all its text
        else:
            t.messages.append(message)
        finish = result.finish_reason.type
        if finish == "abort":
            t.open_turn = True
            self.finish(TrajectoryStatus.ABORTED, "abort", result.finish_reason.message)
        elif finish == "length":
            # A cut-off turn is never followed by another one (no "ghost turns").
            self.finish(TrajectoryStatus.TRUNCATED, "length")
        else:
            c.parse_errors += len(turn.errors)
        return ModelTurn(text, turn_ids, turn, finish)

    def _parse_model_turn(self, turn_ids: Sequence[int]) -> tuple[str, ParsedTurn]:
        return parse_model_turn(self.shared, turn_ids, self.counters.num_tool_calls)

    def pending_model_turn(self) -> ModelTurn | None:
        """The last model turn, when the environment has not answered it yet: a trajectory
        stopped during that turn's tool calls (``RolloutConfig.tools_at_target``). Parsed
        again from its ids, as when it was appended, so its calls keep their ids."""
        t = self.transcript
        if not t.spans or t.spans[-1].kind != "model" or t.open_turn:
            return None
        turn_ids = t.spans[-1].ids
        text, parsed = self._parse_model_turn(turn_ids)
        # A parser may draw random call ids: the assistant message keeps the ones its tool
        # messages must answer to.
        kept = [call.get("id") for call in t.messages[-1].get("tool_calls") or ()]
        if len(kept) == len(parsed.tool_calls) and all(isinstance(i, str) for i in kept):
            calls = tuple(
                dataclasses.replace(call, id=str(call_id))
                for call, call_id in zip(parsed.tool_calls, kept, strict=True)
            )
            parsed = dataclasses.replace(parsed, tool_calls=calls)
        return ModelTurn(text, turn_ids, parsed, "stop")

    def _note_server(self, url: str | None) -> None:
        """Record a move to another server (engine failover: the prefix cache is lost, the
        tokens are not, since every request carries the whole sequence)."""
        if url is not None and self.server is not None and url != self.server:
            turn = self.counters.num_turns + (0 if self.transcript.open_turn else 1)
            self.engine_moves.append({"turn": turn, "from": self.server, "to": url})
        self.server = url or self.server

    def out_of_turns(self) -> bool:
        """True (and truncated) when no model turn is left to read an environment answer."""
        if self.counters.num_turns >= self.shared.config.max_turns:
            self.finish(TrajectoryStatus.TRUNCATED, "max_turns")
            return True
        return False

    def off_boundary(self, turn: ModelTurn) -> bool:
        """True (and truncated) when the turn ended on a stop string, not the template's
        stop token: there is no template boundary to append an environment delta at."""
        if not self.shared.chat.ends_with_stop(turn.ids):
            self.finish(TrajectoryStatus.TRUNCATED, "stop_string")
            return True
        return False

    def record_tool_results(self, names: Sequence[str], results: Sequence[ToolResult]) -> None:
        self.environment.record_tool_results(self.counters.num_turns, results)
        for name, result in zip(names, results, strict=True):
            self.timing.tool_latency.setdefault(name, []).append(result.seconds)
            self.tools.records.append(
                (name, result.seconds, result.attempts, result.is_error, result.error_kind)
            )
            if result.is_error:
                self.counters.tool_errors += 1

    def append_env_turn(
        self,
        step: EnvStep,
        *,
        delta: tuple[Sequence[int], Sequence[ImageRun]] | None = None,
    ) -> bool:
        """Append an environment answer (tool results, interaction or harness messages):
        the chat template's token delta for its messages plus the next generation prompt
        (loss mask 0), drift-checkpointed. False (and truncated, nothing appended) when it
        does not fit :meth:`remaining_budget`. ``delta``: the delta and its image runs when
        the caller (the gateway) computed them already, the same way."""
        shared, t = self.shared, self.transcript
        messages = list(step.messages)
        runs: Sequence[ImageRun] = []
        if delta is not None:
            ids, runs = delta
        else:
            ids = shared.chat.tool_turn_delta(t.messages, messages)
            if shared.vision is not None:
                counts = [image.num_tokens for image in step.images]
                ids, runs = shared.vision.expand(ids, counts)
        if len(ids) >= self.remaining_budget():
            self.finish(TrajectoryStatus.TRUNCATED, "max_response_tokens")
            return False
        t.messages.extend(messages)
        record_images(self.vision, step.images, runs, len(t.prompt_ids) + t.response_len)
        t.spans.append(TokenSpan(step.kind, ids, None))
        if step.kind == "tool":
            self.counters.tool_tokens += len(ids)
        else:
            self.environment.interaction_tokens += len(ids)
            self.environment.appended_turns += 1
        self.checkpoint()
        return True

    def checkpoint(self) -> None:
        """Record a drift checkpoint after an environment delta (O(1); the render and the
        comparison run at the end, or now every ``drift_check_every``-th checkpoint)."""
        config, t = self.shared.config, self.transcript
        if config.drift_check:
            lengths = (len(t.prompt_ids) + t.response_len, len(t.messages), t.model_turns)
            self.drift.checkpoint(lengths, config.drift_check_every, self.drift_view)

    def drift_view(self) -> DriftView:
        """The transcript as it is now, for the drift check."""
        t = self.transcript
        return DriftView(
            self.shared.chat, self.shared.vision, t.ids(), t.messages, self.model_texts()
        )

    def model_texts(self) -> list[str]:
        """Each model turn's raw text (stop token stripped), decoded from its verbatim ids:
        the text :meth:`append_model_turn` parsed, derived again rather than kept."""
        chat, spans = self.shared.chat, self.transcript.spans
        if not chat.family.drift_from_raw_text:  # the drift check renders parsed messages
            return []
        forced = self.transcript.forced
        return [
            chat.model_text(spans[i - 1].id_array + s.id_array if i - 1 in forced else s.id_array)
            for i, s in enumerate(spans)
            if s.kind == "model"
        ]

    # --- freezing and resuming ---------------------------------------------------------

    def freeze(self) -> Trajectory:
        """The finished trajectory (with its resume point when aborted), without a reward."""
        t, c, env = self.transcript, self.counters, self.environment
        resume = None
        if self.status is TrajectoryStatus.ABORTED:
            try:
                resume = self.to_resume_point()
            except ToolRolloutError as exc:  # kept aborted, and says why it cannot go on
                self.error = f"{self.error}; not resumable: {exc}"
        source = self.prompt.metadata.get("data_source")
        return Trajectory(
            uid=self.uid,
            group_id=self.group_id,
            prompt_index=self.prompt_index,
            sample_index=self.sample_index,
            prompt_ids=id_tuple(t.prompt_ids),  # shared ints: 8 bytes a token, not 36
            spans=tuple(t.spans),
            messages=public_messages(self.shared.chat.presented_messages(t.messages)),
            status=self.status,
            finish_reason=self.finish_reason,
            error=self.error,
            num_turns=c.num_turns,
            num_tool_calls=c.num_tool_calls,
            tool_errors=c.tool_errors,
            parse_errors=c.parse_errors,
            weight_version=c.weight_version,
            metrics=self._metrics(),
            ground_truth=self.prompt.ground_truth,
            turn_rewards=env.per_turn(env.turn_rewards, c.num_turns),
            tool_rewards=env.per_turn(env.tool_rewards, c.num_turns),
            tool_final_rewards=dict(env.tool_final_rewards),
            images=tuple(self.vision.images),
            data_source=None if source is None else str(source),
            sampling=sampling_record(self.shared.config, self.shared.seed_round),
            resume_point=resume,
        )

    def _metrics(self) -> dict[str, Any]:
        c, timing = self.counters, self.timing
        metrics: dict[str, Any] = {
            "generation_seconds": round(timing.generation_seconds, 6),
            "tool_seconds": round(timing.tool_seconds, 6),
            "total_seconds": round(timing.total(), 6),
            "tool_latency": {k: [round(x, 6) for x in v] for k, v in timing.tool_latency.items()},
            "drift_mismatches": self.drift.mismatches(),
            "drift_expected": self.drift.expected(),
            "model_tokens": c.model_tokens,
            "tool_tokens": c.tool_tokens,
            "cached_tokens": c.cached_tokens,
        }
        if self.vision.images or self.vision.dropped:
            metrics["images"] = len(self.vision.images)
            metrics["image_tokens"] = self.vision.tokens
            metrics["images_dropped"] = self.vision.dropped
        if self.tools.records:
            metrics["tool_stats"] = {
                name: summary.to_dict()
                for name, summary in summarize_call_records(self.tools.records).items()
            }
        if self.drift.found:
            metrics["drift_reports"] = self.drift.reports()
        if self.engine_moves:
            metrics["engine_moves"] = list(self.engine_moves)
        # [start, end, version] per engine answer (a resume may cross a weight update).
        metrics["weight_versions"] = [list(segment) for segment in self.transcript.segments]
        if c.resumes:
            metrics["resumes"] = c.resumes
        if c.tool_calls_cancelled:
            metrics["tool_calls_cancelled"] = c.tool_calls_cancelled
        metrics.update(self.environment.metrics())
        return metrics

    def to_resume_point(self, model_texts: Sequence[str] | None = None) -> ResumePoint:
        """The state as a JSON resume point. ``model_texts`` (default: decoded from the
        model spans) is written for older readers; this version derives it again."""
        texts = self.model_texts() if model_texts is None else list(model_texts)
        return resume_point_of(self, texts)

    @classmethod
    def resumed_from(cls, shared: RolloutShared, point: ResumePoint) -> TrajectoryState:
        """A fresh running state continuing ``point`` (which stays usable for another try);
        missing optional keys take their defaults, unknown keys are ignored."""
        data = read_payload(point)
        state = cls(shared, data.prompt.row(), **data.identity.fields())
        state.status = TrajectoryStatus.RUNNING
        state.transcript = Transcript(**data.transcript.fields("model_texts"))
        state.counters = data.counters
        state.counters.resumes += 1
        timing = data.timing
        state.timing = Timing(prior_seconds=timing.spent_seconds, **timing.fields("spent_seconds"))
        state.tools = ToolLedger(**data.tools.fields())
        state.drift = DriftLedger(**data.drift.fields())
        state.vision = ImageLedger(**data.vision.fields())
        state.environment = EnvironmentLedger(**data.environment.fields())
        return state


def _joined(first: TokenSpan, more: TokenSpan) -> TokenSpan:
    """An open model turn's first leg and its continuation, as one span (values exact)."""
    assert first.logprob_array is not None and more.logprob_array is not None
    if first.logprob_array.typecode == more.logprob_array.typecode:
        logprobs = first.logprob_array + more.logprob_array
    else:  # one leg needed 8 bytes a value: the whole span does
        logprobs = array("d", first.logprob_array) + array("d", more.logprob_array)
    return TokenSpan("model", first.id_array + more.id_array, logprobs)


def public_messages(messages: Iterable[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    """The messages as trainers see them: no raw model text, otherwise as rendered, so they
    re-render with the official template (arguments and reasoning in the family's form)."""
    return tuple({k: v for k, v in m.items() if k != "raw_content"} for m in messages)


def sampling_record(config: RolloutConfig, seed_round: int = 0) -> dict[str, Any]:
    """:attr:`Trajectory.sampling` of a trajectory rolled out under ``config``."""
    sampling = config.sampling
    return {
        "temperature": float(sampling.temperature),
        "top_p": float(sampling.top_p),
        "top_k": int(sampling.top_k),
        "min_p": float(sampling.min_p),
        "max_new_tokens": int(sampling.max_new_tokens),
        "max_response_tokens": int(config.max_response_tokens),
        "seed": config.seed,
        "seed_round": seed_round,
    }
