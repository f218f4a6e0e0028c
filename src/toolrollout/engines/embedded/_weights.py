"""An in-place weight load: every served tensor paired with its new value (checked before
anything is copied), and the copy, run on the scheduler thread between two steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from toolrollout._exceptions import UserError
from toolrollout.engines.embedded._model import LoadedModel

__all__ = ["CopyPlan", "copy_plan", "copy_weights"]

CopyPlan = list[tuple[torch.Tensor, torch.Tensor]]
"""(served tensor, new value) pairs of an in-place weight load."""


def copy_plan(model: Any, state_dict: Mapping[str, torch.Tensor]) -> CopyPlan:
    """Pair every served tensor with its new value; refuse unknown, missing or misshapen ones.

    Tied weights (one storage under several names, e.g. ``lm_head.weight`` and the
    embeddings) need only one of their names.
    """
    served: dict[str, torch.Tensor] = model.state_dict()
    unknown = sorted(set(state_dict) - set(served))
    by_storage: dict[int, list[str]] = {}
    for name, tensor in served.items():
        by_storage.setdefault(tensor.data_ptr(), []).append(name)
    missing: list[str] = []
    plan: CopyPlan = []
    for names in by_storage.values():
        given = [n for n in names if n in state_dict]
        if not given:
            missing.extend(names)
            continue
        target, value = served[names[0]], state_dict[given[0]]
        if tuple(value.shape) != tuple(target.shape):
            raise UserError(
                f"load_weights: {given[0]} has shape {tuple(value.shape)}, the served model's "
                f"is {tuple(target.shape)}"
            )
        plan.append((target, value))
    if unknown or missing:
        parts = []
        if unknown:
            parts.append(f"unknown names {_few(unknown)}")
        if missing:
            parts.append(f"missing names {_few(missing)}")
        raise UserError(
            "load_weights: the state dict does not match the served model: "
            + "; ".join(parts)
            + " (pass the unwrapped model's state_dict(), without DDP/PEFT prefixes)"
        )
    return plan


def _few(names: list[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def copy_weights(plan: CopyPlan, model: LoadedModel) -> None:
    """Runs on the scheduler thread between steps."""
    del model  # the plan already holds the served tensors
    with torch.no_grad():
        for target, value in plan:
            target.copy_(value.detach())
