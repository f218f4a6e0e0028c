"""EmbeddedEngine.load_weights: a trainer's tensors, copied in place between two steps.

After a load the engine's sampled-token logprobs must be the logprobs of the loaded
weights, computed independently by a Hugging Face forward pass (logits / temperature,
log-softmax); a refused state dict must leave the old weights serving.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from toolrollout import UserError
from toolrollout.apps.demo import DEMO_MODEL_PATH
from toolrollout.engines._types import GenerateRequest, SamplingParams
from toolrollout.engines.embedded import EmbeddedEngine

PROMPT = [1, 2, 3, 4, 5]


def _request() -> GenerateRequest:
    sampling = SamplingParams(max_new_tokens=6, temperature=0.8, seed=7)
    return GenerateRequest(input_ids=tuple(PROMPT), sampling=sampling, return_logprob=True)


def _policy_logprobs(model: Any, ids: tuple[int, ...]) -> list[float]:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([PROMPT + list(ids)])).logits[0]
    scored = torch.log_softmax(logits[len(PROMPT) - 1 : -1] / 0.8, dim=-1)
    return [float(scored[i, t]) for i, t in enumerate(ids)]


def test_loaded_weights_are_the_ones_that_sample() -> None:
    policy: Any = AutoModelForCausalLM.from_pretrained(str(DEMO_MODEL_PATH), dtype=torch.float32)
    policy.eval()
    torch.manual_seed(0)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))

    async def run() -> tuple[Any, Any, list[str]]:
        errors = []
        async with EmbeddedEngine(DEMO_MODEL_PATH, num_threads=1) as engine:
            before = await engine.generate(_request())
            bad_shape = {k: v[:1] if v.dim() else v for k, v in policy.state_dict().items()}
            for wrong in ({"nope": torch.zeros(1)}, bad_shape):
                with pytest.raises(UserError) as caught:
                    await engine.load_weights(wrong, weight_version="bad")
                errors.append(str(caught.value))
            again = await engine.generate(_request())
            assert again.output_logprobs == before.output_logprobs  # refused: old weights
            assert again.weight_version == "default"
            # A tied weight may come under one of its names (as safetensors stores it).
            state = {k: v for k, v in policy.state_dict().items() if k != "lm_head.weight"}
            await engine.load_weights(state, weight_version="7")
            after = await engine.generate(_request())
        return before, after, errors

    _, after, errors = asyncio.run(run())
    assert "unknown names nope" in errors[0] and "missing names" in errors[0]
    assert "shape" in errors[1]
    assert after.weight_version == "7"
    engine_lp = torch.tensor(after.output_logprobs)
    assert torch.allclose(
        engine_lp, torch.tensor(_policy_logprobs(policy, after.output_ids)), atol=1e-4
    )
    # ... and not those of the weights it served before.
    old: Any = AutoModelForCausalLM.from_pretrained(str(DEMO_MODEL_PATH), dtype=torch.float32)
    old.eval()
    gap = (engine_lp - torch.tensor(_policy_logprobs(old, after.output_ids))).abs().max()
    assert gap > 1e-2
