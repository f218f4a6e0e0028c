"""Interactions: a simulated user or environment answering the model's final turns.

- :class:`Interaction` is the seam (verl's ``BaseInteraction`` method names and shapes);
  :class:`InteractionReply` is one answer: done, or a message to append, plus a turn score.
- :func:`load_interaction_config` reads verl's interaction-config YAML; each dataset row
  picks its interaction by ``extra_info.interaction_kwargs.name``.
- :class:`GraderInteraction` grades the demo task and allows retries; :class:`Gsm8kInteraction`
  is verl's GSM8K grader.
"""

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
