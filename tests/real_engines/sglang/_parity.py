"""Teacher-forced float32 logprobs of the demo model: what a trainer recomputes."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

from tests.real_engines.sglang._launch import DEMO_MODEL


@cache
def _model() -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(DEMO_MODEL, dtype=torch.float32)
    model.eval()  # type: ignore[no-untyped-call]
    return model


def recomputed_logprobs(
    prompt_ids: Sequence[int], response_ids: Sequence[int], *, temperature: float = 1.0
) -> list[float]:
    """``log_softmax(logits / temperature)`` at each response token, one forward pass over
    prompt plus response in float32 (SGLang's logprob definition, before top-p/top-k)."""
    import torch

    ids = torch.tensor([list(prompt_ids) + list(response_ids)])
    with torch.no_grad():
        logits = _model()(ids).logits[0].to(torch.float32)
    start = len(prompt_ids)
    scaled = logits[start - 1 : start - 1 + len(response_ids)] / temperature
    chosen = torch.tensor(list(response_ids)).unsqueeze(1)
    return torch.log_softmax(scaled, dim=-1).gather(1, chosen).squeeze(1).tolist()
