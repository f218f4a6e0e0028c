"""What one trajectory holds besides tokens: its interaction, its tool instances, and the
per-turn rewards they give.

Kept apart from the run loop so the loop only asks three things: start the environment,
let the interaction answer a final turn, close the environment (on every way out).

An interaction turn is appended exactly like a tool turn: the chat template's token delta
for the new ``user`` message plus the next generation prompt, loss mask 0, logprob 0.0,
drift-checkpointed, and refused (trajectory truncated) when it would not fit the budgets.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from toolrollout._exceptions import InteractionError, ToolRolloutError, UserError
from toolrollout._records import TokenSpan, TrajectoryStatus
from toolrollout.interactions import InteractionReply
from toolrollout.tools import Tool, ToolContext, ToolResult, ToolSession, row_kwargs

from ._drift import drift_checkpoint

if TYPE_CHECKING:
    from ._loop import RolloutPrompt, RolloutServices, _State

__all__ = ["TrajectoryEnvironment", "interaction_turn", "select_interaction"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_FINALIZE_TIMEOUT = 30.0


def select_interaction(
    interactions: Mapping[str, Any], prompt: RolloutPrompt
) -> tuple[Any | None, dict[str, Any]]:
    """The interaction a row names in ``interaction_kwargs.name``, and those kwargs.

    Rows without ``interaction_kwargs``, and every row when no interaction is configured,
    get none (as in verl). A row naming an unknown interaction is a :class:`UserError`.
    """
    kwargs = row_kwargs(prompt.metadata, "interaction_kwargs")
    if not interactions or not kwargs:
        return None, {}
    name = kwargs.get("name")
    if not isinstance(name, str):
        raise UserError(
            "extra_info.interaction_kwargs needs a 'name' choosing one of the configured "
            f"interactions ({', '.join(sorted(interactions))})"
        )
    if name not in interactions:
        raise UserError(
            f"interaction_kwargs.name {name!r} is not configured; available: "
            f"{', '.join(sorted(interactions))}"
        )
    if kwargs.get("ground_truth") is None and prompt.ground_truth is not None:
        kwargs["ground_truth"] = prompt.ground_truth
    return interactions[name], kwargs


class TrajectoryEnvironment:
    """One trajectory's interaction (if any) and stateful-tool session.

    Rewards are kept by model turn number (1-based, the value of ``num_turns`` right after
    that turn was appended), so they line up with the trajectory's turns.
    """

    def __init__(
        self,
        instance_id: str,
        prompt: RolloutPrompt,
        interaction: Any | None = None,
        interaction_kwargs: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = 60.0,
    ) -> None:
        self.instance_id = instance_id
        self.interaction = interaction
        self.interaction_kwargs = dict(interaction_kwargs or {})
        self.timeout = timeout
        self.tools = ToolSession(instance_id, prompt.metadata)
        self.turn_rewards: dict[int, float] = {}
        self.tool_rewards: dict[int, float] = {}
        self.tool_final_rewards: dict[str, float] = {}
        self.interaction_turns = 0
        """Replies received (each judged one model turn)."""
        self.appended_turns = 0
        """Replies appended to the transcript (not the closing ones)."""
        self.interaction_tokens = 0
        self.interaction_metrics: list[dict[str, Any]] = []
        self.errors: list[str] = []
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
        self.interaction_turns += 1
        if reply.metrics:
            self.interaction_metrics.append(dict(reply.metrics))
        return reply

    def record_tool_results(self, turn: int, results: Sequence[ToolResult]) -> None:
        """Keep the sum of the per-call rewards of one turn's tool calls (if any gave one)."""
        rewards = [r.reward for r in results if r.reward is not None]
        if rewards:
            self.tool_rewards[turn] = self.tool_rewards.get(turn, 0.0) + sum(rewards)

    def per_turn(self, rewards: Mapping[int, float], num_turns: int) -> tuple[float | None, ...]:
        """``rewards`` as one entry per model turn (None where the turn got none)."""
        return tuple(rewards.get(turn) for turn in range(1, num_turns + 1))

    async def close(self, *, score: bool) -> None:
        """Ask tools for their rewards (when ``score``), then release every tool instance
        and finalize the interaction, whatever happened before (cancellation included)."""
        try:
            if score:
                self.tool_final_rewards = await self.tools.calc_rewards()
        finally:
            await self.tools.release_all()
            self.errors.extend(f"release {e}" for e in self.tools.release_errors)
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
                        self.errors.append(str(exc))
                        logger.warning("%s", exc)

    def metrics(self) -> dict[str, Any]:
        """Numbers for the trajectory's ``metrics`` column."""
        out: dict[str, Any] = {}
        if self.interaction is not None:
            out["interaction_turns"] = self.interaction_turns
            out["interaction_tokens"] = self.interaction_tokens
        if self.interaction_metrics:
            out["interaction_metrics"] = self.interaction_metrics
        if self.errors:
            out["environment_errors"] = list(self.errors)
        return out


async def interaction_turn(
    services: RolloutServices, state: _State, output_ids: Sequence[int]
) -> bool:
    """After a final model turn: let the interaction answer. True when the conversation
    goes on (its message was appended), False when the trajectory has ended."""
    env = state.env
    assert env is not None and env.interaction is not None
    config = services.config
    chat = services.chat
    public = [{k: v for k, v in m.items() if k != "raw_content"} for m in state.messages]
    reply = await env.respond(public)
    if reply.reward is not None:
        env.turn_rewards[state.num_turns] = reply.reward
    if reply.done:
        state.end(TrajectoryStatus.COMPLETED, "stop")
        return False
    if state.num_turns >= config.max_turns:
        state.end(TrajectoryStatus.TRUNCATED, "max_turns")
        return False
    limit = config.max_interaction_turns
    if limit is not None and env.appended_turns >= limit:
        state.end(TrajectoryStatus.TRUNCATED, "max_interaction_turns")
        return False
    if not chat.ends_with_stop(output_ids):
        state.end(TrajectoryStatus.TRUNCATED, "stop_string")
        return False
    message = {"role": "user", "content": reply.message}
    delta = chat.tool_turn_delta(state.messages, [message])
    budget = config.max_response_tokens - state.response_len
    if services.context_length is not None:
        budget = min(budget, services.context_length - len(state.prompt_ids) - state.response_len)
    if len(delta) >= budget:
        state.end(TrajectoryStatus.TRUNCATED, "max_response_tokens")
        return False
    state.messages.append(message)
    state.spans.append(TokenSpan("interaction", tuple(delta), (0.0,) * len(delta)))
    env.interaction_tokens += len(delta)
    env.appended_turns += 1
    drift_checkpoint(services, state)
    return True
