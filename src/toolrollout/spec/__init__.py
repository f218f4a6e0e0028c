"""One composition root for every way of running rollouts.

:class:`RunSpec` names a run (engine, model, tools, rewards, interactions, vision, config);
:func:`open_run` turns it into an open engine and a runner, :func:`build_runner` into a
runner on an engine the caller holds. The CLI, the Ray worker, eval, bench and the trainer
adapters all go through them. The defaults (the reward chosen from the ground truths,
:func:`default_rewards`; vision detected from the model folder, :func:`detect_vision`; the
engine's context length from ``Engine.info()``) are the runner's own, so a
:class:`~toolrollout.rollout.RolloutRunner` built directly behaves the same; the checks that a
leftover file suits the run are :func:`check_leftover_matches`.
"""

from toolrollout.engines._factory import connect as connect
from toolrollout.rollout._compat import chat_setup as chat_setup
from toolrollout.rollout._compat import check_leftover_matches as check_leftover_matches
from toolrollout.rollout._compat import effective_tool_parser as effective_tool_parser
from toolrollout.rollout._compat import leftover_info as leftover_info
from toolrollout.rollout._compat import tokenizer_fingerprint as tokenizer_fingerprint
from toolrollout.rollout._defaults import VisionMode as VisionMode
from toolrollout.rollout._defaults import default_rewards as default_rewards
from toolrollout.rollout._defaults import detect_vision as detect_vision
from toolrollout.rollout._defaults import is_number as is_number

from ._open import OpenRun as OpenRun
from ._open import RunParts as RunParts
from ._open import build_runner as build_runner
from ._open import check_interactions as check_interactions
from ._open import load_parts as load_parts
from ._open import open_run as open_run
from ._policy import load_tokenizer as load_tokenizer
from ._spec import RunSpec as RunSpec
from ._spec import check_target_groups as check_target_groups

__all__ = [
    "OpenRun",
    "RunParts",
    "RunSpec",
    "VisionMode",
    "build_runner",
    "chat_setup",
    "check_interactions",
    "check_leftover_matches",
    "check_target_groups",
    "connect",
    "default_rewards",
    "detect_vision",
    "effective_tool_parser",
    "is_number",
    "leftover_info",
    "load_parts",
    "load_tokenizer",
    "open_run",
    "tokenizer_fingerprint",
]
