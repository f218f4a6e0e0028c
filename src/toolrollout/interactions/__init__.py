"""Interactions: a simulated user or environment answering the model's final turns, with
verl's ``BaseInteraction`` seam and interaction-config YAML."""

from __future__ import annotations

from ._base import Interaction as Interaction
from ._base import InteractionReply as InteractionReply
from ._config import load_interaction_config as load_interaction_config
from ._grader import GraderInteraction as GraderInteraction
from ._grader import Gsm8kInteraction as Gsm8kInteraction

__all__ = [
    "GraderInteraction",
    "Gsm8kInteraction",
    "Interaction",
    "InteractionReply",
    "load_interaction_config",
]
