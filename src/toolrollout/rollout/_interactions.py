"""The interaction turn: after a final model turn, the row's interaction may answer. Its
message is appended like a tool turn's (:meth:`TrajectoryState.append_env_turn`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from toolrollout._exceptions import UserError
from toolrollout._records import RolloutPrompt, TrajectoryStatus
from toolrollout.tools._lifecycle import row_kwargs

from ._environment import TrajectoryEnvironment
from ._state import TrajectoryState, public_messages
from ._types import EnvStep, ModelTurn

__all__ = ["check_interactions", "interaction_step", "select_interaction"]


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


def check_interactions(
    interactions: Mapping[str, Any],
    prompts: Sequence[RolloutPrompt],
    *,
    source: str,
    names: Sequence[str] | None = None,
) -> None:
    """A one-line :class:`UserError` (``<source> row <i>: ...``, or ``names[i]`` for
    ``row <i>``) for the first row naming an interaction that is not configured: a dataset
    mistake reported before anything runs."""
    for index, prompt in enumerate(prompts):
        try:
            select_interaction(interactions, prompt)
        except UserError as exc:
            name = names[index] if names is not None else f"row {index}"
            raise UserError(f"{source} {name}: {exc}") from exc


async def interaction_step(
    state: TrajectoryState, turn: ModelTurn, env: TrajectoryEnvironment
) -> EnvStep | None:
    """Ask the interaction to answer a final turn: its message, or None when it ends."""
    reply = await env.respond(public_messages(state.transcript.messages))
    if reply.reward is not None:
        state.environment.turn_rewards[state.num_turns] = reply.reward
    if reply.done:
        state.finish(TrajectoryStatus.COMPLETED, "stop")
        return None
    if state.out_of_turns():
        return None
    limit = state.shared.config.max_interaction_turns
    if limit is not None and state.environment.appended_turns >= limit:
        state.finish(TrajectoryStatus.TRUNCATED, "max_interaction_turns")
        return None
    if state.off_boundary(turn):
        return None
    return EnvStep("interaction", ({"role": "user", "content": reply.message},))
