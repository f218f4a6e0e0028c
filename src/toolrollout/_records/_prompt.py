"""The dataset row a rollout starts from: a record that data loaders, the runner and the
resume point share, so that loading prompts needs nothing of the loop."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["RolloutPrompt"]


@dataclass(frozen=True, slots=True)
class RolloutPrompt:
    """One dataset row: the opening messages and, optionally, the ground truth."""

    messages: tuple[dict[str, Any], ...]
    ground_truth: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)
