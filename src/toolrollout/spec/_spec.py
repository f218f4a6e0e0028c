"""``RunSpec``: everything a rollout run is made of, checked once.

Every entry point fills one :class:`RunSpec`, so a CLI run, a Ray shard and a Python caller
get the same one-line errors, naming the fields (:class:`FieldError`). A frozen dataclass
of plain values, so a Ray driver can ship it to its workers as it is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from toolrollout._exceptions import FieldError, UserError
from toolrollout.rollout import RolloutConfig
from toolrollout.rollout._defaults import VisionMode, default_rewards

if TYPE_CHECKING:
    from toolrollout.chat import VisionFormat
    from toolrollout.interactions import Interaction
    from toolrollout.rewards import WeightedReward
    from toolrollout.rollout import Trajectory, TrajectoryHooks
    from toolrollout.tools import Tool

    Reward = Callable[[Trajectory], Any] | WeightedReward

__all__ = ["FieldError", "RunSpec", "VisionMode", "check_target_groups"]


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """A rollout run: engine, model, tools, rewards, interactions, vision and budgets.

    Engine: ``engine_urls`` (SGLang or vLLM servers; ``engine`` says which, or ``auto``
    finds out; waited on for ``health_timeout`` seconds; ``request_timeout``, ``retries``
    (attempts) and ``retry_budget`` (seconds of retrying) tune the client, ``None`` keeps
    its defaults; ``failover_after`` failed attempts in a row move a server's trajectories
    to a healthy one, 0 never), or none for the embedded engine on ``model``. ``model`` is
    also the tokenizer folder; ``None`` means the bundled demo model (or, for
    :func:`~toolrollout.spec.build_runner` given a tokenizer, no folder at all).

    Tools: ``tool_config`` (a verl-layout YAML) or ``tools``; neither means the built-in
    calculator. Interactions: ``interaction_config`` or ``interactions`` (by name).
    Rewards: a sequence, or ``"auto"`` (:func:`~toolrollout.spec.default_rewards`).

    ``flush_every``, ``resume``, ``target_groups`` and ``keep_groups_whole`` are the
    run-level options a ``generate`` run and its Ray shards share.
    """

    engine_urls: tuple[str, ...] = ()
    engine: Literal["auto", "sglang", "vllm"] = "auto"
    """The kind of server at ``engine_urls``; ``auto`` asks them (``engines.connect``)."""
    engine_api_key: str | None = field(default=None, repr=False)
    """Sent as ``Authorization: Bearer`` to ``engine_urls`` (never in the repr)."""
    model: Path | None = None
    tool_config: Path | None = None
    tools: Sequence[Tool] | None = None
    """Tool objects (stored as a tuple); None: ``tool_config``, else the calculator."""
    interaction_config: Path | None = None
    interactions: Mapping[str, Interaction] | None = None
    rewards: Literal["auto"] | Sequence[Reward] = "auto"
    """Reward terms (stored as a tuple), or ``"auto"``: chosen from the ground truths."""
    tool_error_penalty: float = 0.0
    vision: VisionMode | VisionFormat = "auto"
    config: RolloutConfig = field(default_factory=RolloutConfig)
    hooks: TrajectoryHooks | None = None
    """A custom environment (:class:`~toolrollout.TrajectoryHooks` subclass); None: tools
    and interactions as configured."""
    threads: int = 1
    health_timeout: float = 120.0
    request_timeout: float | None = None
    retries: int | None = None
    retry_budget: float | None = None
    failover_after: int = 3
    flush_every: int = 64
    resume: bool = False
    target_groups: int | None = None
    keep_groups_whole: bool = True

    def __post_init__(self) -> None:
        # Sequences and strings from a caller become the stored types (tuples, Paths).
        set_ = object.__setattr__
        if isinstance(self.engine_urls, str):
            set_(self, "engine_urls", (self.engine_urls,))
        set_(self, "engine_urls", tuple(self.engine_urls))
        for name in ("model", "tool_config", "interaction_config"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Path):
                set_(self, name, Path(value))
        if self.tools is not None:
            set_(self, "tools", tuple(self.tools))
        if self.rewards != "auto":
            if isinstance(self.rewards, str):
                raise FieldError(
                    f"{{rewards}} must be 'auto' or a sequence, got {self.rewards!r}", "rewards"
                )
            set_(self, "rewards", tuple(self.rewards))
        self._check()

    def _check(self) -> None:
        from toolrollout.chat.parsers import tool_parser_names

        if any(not isinstance(u, str) or not u.strip() for u in self.engine_urls):
            raise FieldError(
                f"{{engine_urls}} must be server URLs, got {list(self.engine_urls)}", "engine_urls"
            )
        if self.engine not in ("auto", "sglang", "vllm"):
            raise FieldError(
                f"{{engine}} must be auto, sglang or vllm, got {self.engine!r}", "engine"
            )
        if self.engine != "auto" and not self.engine_urls:
            raise FieldError(
                f"{{engine}} {self.engine} needs {{engine_urls}} (the server to use)",
                "engine",
                "engine_urls",
            )
        if self.tools is not None and self.tool_config is not None:
            raise FieldError(
                "{tool_config}: pass a tool config or Tool objects, not both", "tool_config"
            )
        if self.interactions is not None and self.interaction_config is not None:
            raise FieldError(
                "{interaction_config}: pass an interaction config or interactions, not both",
                "interaction_config",
            )
        if isinstance(self.vision, str) and self.vision not in ("auto", "on", "off"):
            raise FieldError(
                f"{{vision}} must be 'auto', 'on' or 'off', got {self.vision!r}", "vision"
            )
        if not isinstance(self.config, RolloutConfig):
            raise FieldError(
                f"{{config}} must be a RolloutConfig, got {type(self.config).__name__}", "config"
            )
        parser = self.config.tool_parser
        if parser is not None and parser not in tool_parser_names():
            raise FieldError(
                f"unknown {{config.tool_parser}} {parser!r}; choose from "
                + ", ".join(tool_parser_names()),
                "config.tool_parser",
            )
        _at_least("tool_error_penalty", self.tool_error_penalty, 0.0)
        _at_least("threads", self.threads, 1)
        _at_least("health_timeout", self.health_timeout, 0.0)
        _at_least("flush_every", self.flush_every, 1)
        if self.request_timeout is not None and not self.request_timeout > 0:
            raise FieldError(
                f"{{request_timeout}} must be positive, got {self.request_timeout}",
                "request_timeout",
            )
        if self.retries is not None:
            _at_least("retries", self.retries, 1)
        if self.retry_budget is not None:
            _at_least("retry_budget", self.retry_budget, 0.0)
        _at_least("failover_after", self.failover_after, 0)
        if self.target_groups is not None:
            _at_least("target_groups", self.target_groups, 1)
            if self.resume:
                raise FieldError(
                    "{resume} cannot be combined with {target_groups}", "resume", "target_groups"
                )

    def replace(self, **changes: Any) -> RunSpec:
        """A copy with ``changes``, checked again."""
        return dataclasses.replace(self, **changes)

    @property
    def model_path(self) -> Path:
        """The model (and tokenizer) folder: ``model``, or the bundled demo model."""
        if self.model is not None:
            return self.model
        from toolrollout.apps.demo import DEMO_MODEL_PATH

        return DEMO_MODEL_PATH

    @property
    def batch(self) -> bool:
        """Whether the run stops at a batch target (straggler control)."""
        return self.target_groups is not None

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments for :class:`~toolrollout.engines.SGLangClient` (pool size, key,
        timeouts, retry)."""
        from toolrollout.engines import connection_limits

        # the pool holds every request the run may have in flight (never a silent cap)
        options: dict[str, Any] = {"limits": connection_limits(self.config.concurrency)}
        if self.engine_api_key:
            options["api_key"] = self.engine_api_key
        if self.request_timeout is not None:
            import httpx

            seconds = self.request_timeout
            options["timeout"] = httpx.Timeout(seconds, connect=min(seconds, 10.0))
        if self.retries is not None or self.retry_budget is not None:
            from toolrollout.engines import ENGINE_RETRY

            options["retry"] = dataclasses.replace(
                ENGINE_RETRY,
                max_attempts=ENGINE_RETRY.max_attempts if self.retries is None else self.retries,
                budget_s=ENGINE_RETRY.budget_s if self.retry_budget is None else self.retry_budget,
                retry_timeouts=True,
            )
        if self.failover_after != 3:
            options["failover_after"] = self.failover_after or None
        return options

    def rewards_for(self, ground_truths: Sequence[object] = ()) -> tuple[Reward, ...]:
        """The reward terms: the explicit ones, or for ``"auto"`` those the truths call for."""
        if self.rewards != "auto":
            return tuple(self.rewards)
        return tuple(default_rewards(ground_truths, tool_error_penalty=self.tool_error_penalty))


def check_target_groups(target_groups: int, num_prompts: int) -> None:
    """A batch target must be reachable: between 1 and the number of prompts (groups)."""
    if not 1 <= target_groups <= num_prompts:
        raise UserError(
            f"target_groups must be between 1 and the {num_prompts} prompts, got {target_groups}"
        )


def _at_least(name: str, value: float, low: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FieldError(f"{{{name}}} must be a number, got {value!r}", name)
    if value < low:
        raise FieldError(f"{{{name}}} must be at least {low}, got {value}", name)
