"""What one trajectory holds besides tokens: its interaction, its tool instances, and the
per-turn rewards they give. The live part (:class:`TrajectoryEnvironment`) is opened for
each leg and closed on every way out; its bookkeeping (:class:`EnvironmentLedger`) belongs
to the trajectory's state, so a resumed trajectory keeps it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio

from toolrollout._exceptions import InteractionError, ToolRolloutError
from toolrollout.interactions import InteractionReply
from toolrollout.tools import Tool, ToolContext, ToolResult, ToolSession

__all__ = ["EnvironmentLedger", "TrajectoryEnvironment"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_FINALIZE_TIMEOUT = 30.0


@dataclass(slots=True)
class EnvironmentLedger:
    """The environment's bookkeeping of one trajectory, kept across resumes. Rewards are
    kept by model turn number (1-based: ``num_turns`` right after that turn)."""

    has_interaction: bool = False
    turn_rewards: dict[int, float] = field(default_factory=dict)
    tool_rewards: dict[int, float] = field(default_factory=dict)
    tool_final_rewards: dict[str, float] = field(default_factory=dict)
    """``calc_reward`` of each stateful tool instance at the end (not carried by a resume)."""
    interaction_turns: int = 0
    """Replies received (each judged one model turn)."""
    appended_turns: int = 0
    """Replies appended to the transcript (not the closing ones)."""
    interaction_tokens: int = 0
    interaction_metrics: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def record_tool_results(self, turn: int, results: Sequence[ToolResult]) -> None:
        """Keep the sum of the per-call rewards of one turn's tool calls (if any gave one)."""
        rewards = [r.reward for r in results if r.reward is not None]
        if rewards:
            self.tool_rewards[turn] = self.tool_rewards.get(turn, 0.0) + sum(rewards)

    @staticmethod
    def per_turn(rewards: Mapping[int, float], num_turns: int) -> tuple[float | None, ...]:
        """``rewards`` as one entry per model turn (None where the turn got none)."""
        return tuple(rewards.get(turn) for turn in range(1, num_turns + 1))

    def metrics(self) -> dict[str, Any]:
        """Numbers for the trajectory's ``metrics`` column."""
        out: dict[str, Any] = {}
        if self.has_interaction:
            out["interaction_turns"] = self.interaction_turns
            out["interaction_tokens"] = self.interaction_tokens
        if self.interaction_metrics:
            out["interaction_metrics"] = self.interaction_metrics
        if self.errors:
            out["environment_errors"] = list(self.errors)
        return out


class TrajectoryEnvironment:
    """One trajectory leg's interaction (if any) and stateful-tool session."""

    def __init__(
        self,
        instance_id: str,
        metadata: Mapping[str, Any],
        ledger: EnvironmentLedger,
        interaction: Any | None = None,
        interaction_kwargs: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = 60.0,
    ) -> None:
        self.instance_id = instance_id
        self.interaction = interaction
        self.interaction_kwargs = dict(interaction_kwargs or {})
        self.timeout = timeout
        self.tools = ToolSession(instance_id, metadata)
        self.ledger = ledger
        ledger.has_interaction = interaction is not None
        self._started = False

    async def _guard(
        self, what: str, call: Callable[[], Awaitable[T]], limit: float | None = None
    ) -> T:
        """Run one interaction method under the timeout; failures become InteractionError."""
        name = getattr(self.interaction, "name", type(self.interaction).__name__)
        limit = self.timeout if limit is None else limit
        try:
            with anyio.fail_after(limit):
                return await call()
        except TimeoutError as exc:
            raise InteractionError(
                f"interaction {name!r}: {what} took longer than {limit} s"
            ) from exc
        except ToolRolloutError:
            raise
        except Exception as exc:
            raise InteractionError(
                f"interaction {name!r}: {what} raised {type(exc).__name__}: {exc}"
            ) from exc

    async def start(self, tools: Iterable[Tool], context: ToolContext) -> None:
        """Start the interaction, then create the tool instances the row declares."""
        interaction = self.interaction
        if interaction is not None:
            started = await self._guard(
                "start_interaction",
                lambda: interaction.start_interaction(self.instance_id, **self.interaction_kwargs),
            )
            self._started = True
            if isinstance(started, str) and started:
                self.instance_id = started
        await self.tools.create_declared(tools, context)

    async def respond(self, messages: Sequence[Mapping[str, Any]]) -> InteractionReply:
        """Ask the interaction to answer the conversation (it ends with the model's turn)."""
        interaction = self.interaction
        if interaction is None:
            raise InteractionError("this trajectory has no interaction")
        view = [dict(m) for m in messages]
        value = await self._guard(
            "generate_response",
            lambda: interaction.generate_response(
                self.instance_id, view, **self.interaction_kwargs
            ),
        )
        reply = InteractionReply.coerce(value)
        self.ledger.interaction_turns += 1
        if reply.metrics:
            self.ledger.interaction_metrics.append(dict(reply.metrics))
        return reply

    async def close(self, *, score: bool) -> None:
        """Ask tools for their rewards (when ``score``), then release every tool instance
        and finalize the interaction, whatever happened before (cancellation included)."""
        try:
            if score:
                self.ledger.tool_final_rewards = await self.tools.calc_rewards()
        finally:
            await self.tools.release_all()
            self.ledger.errors.extend(f"release {e}" for e in self.tools.release_errors)
            if self._started and self.interaction is not None:
                self._started = False
                interaction = self.interaction
                with anyio.CancelScope(shield=True):
                    try:
                        await self._guard(
                            "finalize_interaction",
                            lambda: interaction.finalize_interaction(self.instance_id),
                            # shielded cleanup must end even when calls are unbounded
                            limit=self.timeout or _FINALIZE_TIMEOUT,
                        )
                    except InteractionError as exc:
                        self.ledger.errors.append(str(exc))
                        logger.warning("%s", exc)
