"""Rollout settings: budgets, sampling and concurrency in one frozen value."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from toolrollout._exceptions import UserError
from toolrollout.chat import TemplateFamily
from toolrollout.chat.families import get_template_family
from toolrollout.engines._scheduling import SchedulingConfig
from toolrollout.engines._types import SamplingParams
from toolrollout.rewards import RewardMix

__all__ = ["InexactLogprobsPolicy", "RolloutConfig", "ToolUnavailablePolicy", "ToolsAtTarget"]

TruncateSide = Literal["left", "right", "middle"]
ToolUnavailablePolicy = Literal["fail", "show"]
ToolsAtTarget = Literal["cancel", "finish"]
InexactLogprobsPolicy = Literal["refuse", "label"]


@dataclass(frozen=True, slots=True)
class RolloutConfig:
    """How each trajectory is run.

    Every budget ends the trajectory where it is used up (status ``truncated``); no turn is
    ever generated after a length-truncated one.
    """

    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(max_new_tokens=256))
    """Per-turn sampling; ``max_new_tokens`` is the per-turn cap (budgets may lower it)."""
    n: int = 1
    """Samples per prompt (one GRPO group)."""
    max_turns: int = 8
    """Maximum assistant turns per trajectory."""
    max_tool_calls_per_turn: int = 8
    max_tool_calls: int = 32
    """Maximum tool calls over the whole trajectory."""
    max_response_tokens: int = 4096
    """Budget over all response tokens, model and tool tokens together."""
    context_length: int | None = None
    """Prompt + response cap; defaults to the engine's/model's context length when known."""
    max_tool_response_tokens: int = 512
    """Each tool result is cut to this many tokens before it enters the context."""
    tool_response_truncate_side: TruncateSide = "middle"
    concurrency: int = 256
    """Cap on in-flight engine requests across all trajectories."""
    seed: int | None = None
    """Base seed; each (prompt, sample, turn) derives its own engine seed from it."""
    tool_parser: str | None = None
    """Tool-call text format of the model (see ``toolrollout.chat``); None: the parser of
    the model family (``TemplateFamily.tool_parser``)."""
    family: str | TemplateFamily | None = None
    """Model family: a name from ``toolrollout.chat.template_families()`` (e.g.
    ``"mistral"``) or a :class:`~toolrollout.chat.TemplateFamily` of your own; None:
    detected from what the tokenizer's chat template renders."""
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict, hash=False)
    """Extra chat-template variables for every render, e.g. ``{"enable_thinking": False}``
    for Qwen3 (``--chat-template-kwargs`` on the command line)."""
    drift_check: bool = True
    """Compare the token transcript with a fresh render of the messages (docs/rollouts.md)."""
    drift_check_every: int | None = None
    """Also check after every K-th tool/interaction turn. None (default): check once, at the
    end of the trajectory, so a turn's cost stays flat in the conversation's length. Either
    way, once drift is found every turn is checked and reported, as with K=1."""
    reward_mix: RewardMix = field(default_factory=RewardMix)
    """How reward functions, interaction turn rewards and tool rewards make the reward."""
    interaction_timeout: float | None = 60.0
    """Seconds one interaction call may take (None: no limit)."""
    max_interaction_turns: int | None = None
    """Interaction messages appended per trajectory at most (None: only the other budgets
    apply); the next one the interaction asks for truncates the trajectory instead."""
    max_images: int | None = None
    """Most images one trajectory shows the model (None: no limit). Images past it are left
    out whole, and the tool message says so."""
    max_image_tokens: int | None = None
    """Most image placeholder tokens per trajectory (None: no limit); same rule."""
    tool_unavailable: ToolUnavailablePolicy = "fail"
    """What a tool call that ends *unavailable* (its service down after the retries, or its
    circuit breaker open) does to the trajectory. ``"fail"`` (default): the trajectory ends
    ``failed`` (``finish_reason="tool_unavailable"``, the tool and the error in ``error``)
    and is not scored, because the model did nothing wrong and a reward of 0 would teach
    it so. ``"show"``: the model reads the error as the tool's result and the run goes on
    (for training on tool faults)."""
    trajectory_timeout: float | None = None
    """Wall-clock seconds one trajectory may take; past it the row is ``failed`` (``timeout``)
    and its in-flight engine request and tool calls are cancelled. None: no deadline."""
    tools_at_target: ToolsAtTarget = "cancel"
    """Tool calls still running when a batch target is met (``run_batch``, ``resume``):
    ``"cancel"`` (default) cancels them, as a timeout does, and their trajectories end
    ``aborted`` after their model turn; resumed, they run that turn's calls again. So the
    batch comes back at its target instead of after the slowest tool call then running.
    ``"finish"`` lets them finish first (their results are kept for the resume)."""

    inexact_logprobs: InexactLogprobsPolicy = "refuse"
    """What a run does when its engine says its logprobs are not the checkpoint's sampling
    distribution (``Engine.logprob_mismatch``, asked once at the start: e.g. SGLang serving
    a float32 checkpoint in float16). ``"refuse"`` (default): the run raises
    :class:`~toolrollout.exceptions.InexactLogprobsError` with the reason and the fix.
    ``"label"``: it runs, and every trajectory carries the reason in
    ``metrics["logprob_mismatch"]``, so a trainer can tell such rows apart."""

    scheduling: SchedulingConfig | None = None
    """Client-side scheduling policies (request priority, adaptive admission, GRPO group
    affinity; see docs/benchmarks.md). None (default): none, requests go out as they come."""

    def __post_init__(self) -> None:
        positive = {
            "n": self.n,
            "max_turns": self.max_turns,
            "max_tool_calls_per_turn": self.max_tool_calls_per_turn,
            "max_response_tokens": self.max_response_tokens,
            "max_tool_response_tokens": self.max_tool_response_tokens,
            "concurrency": self.concurrency,
        }
        for name, value in positive.items():
            if value < 1:
                raise UserError(f"{name} must be at least 1, got {value}")
        if self.drift_check_every is not None and self.drift_check_every < 1:
            raise UserError(f"drift_check_every must be >= 1 or None, got {self.drift_check_every}")
        if self.trajectory_timeout is not None and self.trajectory_timeout <= 0:
            raise UserError(f"trajectory_timeout must be > 0, got {self.trajectory_timeout}")
        if self.max_tool_calls < 0:
            raise UserError(f"max_tool_calls must be >= 0, got {self.max_tool_calls}")
        for name in ("max_images", "max_image_tokens"):
            limit = getattr(self, name)
            if limit is not None and limit < 0:
                raise UserError(f"{name} must be >= 0 or None, got {limit}")
        if self.sampling.n != 1:
            raise UserError("set RolloutConfig.n for several samples, not sampling.n")
        if isinstance(self.family, str):
            get_template_family(self.family)  # a one-line error naming the known families
        if not isinstance(self.chat_template_kwargs, Mapping) or not all(
            isinstance(key, str) for key in self.chat_template_kwargs
        ):
            raise UserError(
                "chat_template_kwargs must map variable names to values, e.g. "
                '{"enable_thinking": false}'
            )
        if self.max_interaction_turns is not None and self.max_interaction_turns < 0:
            raise UserError(f"max_interaction_turns must be >= 0, got {self.max_interaction_turns}")
        if self.interaction_timeout is not None and not self.interaction_timeout > 0:
            raise UserError(
                f"interaction_timeout must be positive seconds, got {self.interaction_timeout}"
            )
        for name, choice in (
            ("tools_at_target", ToolsAtTarget),
            ("inexact_logprobs", InexactLogprobsPolicy),
            ("tool_unavailable", ToolUnavailablePolicy),
        ):
            value, (first, second) = getattr(self, name), get_args(choice)
            if value not in (first, second):
                raise UserError(f"{name} must be {first!r} or {second!r}, got {value!r}")
        if self.tool_response_truncate_side not in ("left", "right", "middle"):
            raise UserError(
                "tool_response_truncate_side must be left, right or middle, "
                f"got {self.tool_response_truncate_side!r}"
            )
