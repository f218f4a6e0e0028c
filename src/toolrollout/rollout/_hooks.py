"""Where a custom environment plugs into the run loop, without forking it.

:func:`~toolrollout.rollout._loop.run_trajectory` fixes the order of a trajectory's phases
and keeps the token bookkeeping; a hook decides *what* happens (``should_stop``,
``on_model_turn``, ``env_step``, ``score``), never how tokens are appended.
"""

from __future__ import annotations

from toolrollout._records import Trajectory
from toolrollout.rewards._base import evaluate_terms

from ._environment import TrajectoryEnvironment
from ._interactions import interaction_step
from ._state import TrajectoryState
from ._turns import tool_step
from ._types import EnvStep, ModelTurn

__all__ = ["EnvStep", "ModelTurn", "TrajectoryHooks"]


class TrajectoryHooks:
    """The default environment: tools answer tool calls, the row's interaction (if any)
    answers a final turn, reward functions score the finished trajectory.

    Every hook gets the running :class:`TrajectoryState` (read its ``transcript``,
    ``counters``, ``shared.config``; end it with ``state.finish(status, reason)``). One
    instance serves every trajectory of a run concurrently: keep per-trajectory data on
    the state (``state.tools.state`` is a free dict), not on ``self``.
    """

    def should_stop(self, state: TrajectoryState) -> str | None:
        """Before each model turn: a finish reason to end the trajectory ``truncated``
        instead of generating, or None to go on. Default: ``max_turns``."""
        if state.num_turns >= state.shared.config.max_turns and not state.transcript.open_turn:
            return "max_turns"
        return None

    async def on_model_turn(self, state: TrajectoryState, turn: ModelTurn) -> None:
        """After a model turn is appended (and parsed), before the environment answers.

        May end the trajectory (``state.finish``); then no environment step runs. Also
        called for a turn the engine cut (the state is then already ``aborted`` or
        ``truncated``). Default: nothing.
        """

    async def env_step(
        self, state: TrajectoryState, turn: ModelTurn, env: TrajectoryEnvironment
    ) -> EnvStep | None:
        """The environment's answer to a model turn, or None to end the trajectory.

        The answer's messages are appended as one token delta (loss mask 0) if the budget
        allows. Returning None without calling ``state.finish`` ends it ``completed``
        (``stop``). Default: run the turn's tool calls; a turn without calls goes to the
        row's interaction, if it has one.
        """
        if turn.parsed.tool_calls or turn.parsed.errors:
            return await tool_step(state, turn, env.tools)
        if env.interaction is not None:
            return await interaction_step(state, turn, env)
        return None

    async def score(
        self, state: TrajectoryState, trajectory: Trajectory
    ) -> tuple[float | None, dict[str, float]]:
        """The reward of a completed or truncated trajectory, and its named terms.

        An exception here marks the row ``failed`` (``reward_error``), never a silent 0.
        Default: the runner's reward functions, mixed with the interaction's turn rewards
        and the tools' rewards by ``RolloutConfig.reward_mix``.
        """
        shared = state.shared
        outcome: float | None = None
        details: dict[str, float] = {}
        if shared.rewards:
            outcome, details = await evaluate_terms(shared.rewards, trajectory)
        reward, terms = shared.config.reward_mix.combine(
            outcome,
            trajectory.turn_rewards,
            trajectory.tool_rewards,
            trajectory.tool_final_rewards,
        )
        return reward, {**details, **terms}
