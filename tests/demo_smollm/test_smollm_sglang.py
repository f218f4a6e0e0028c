"""SmolLM2 served by a real SGLang server: calculator rollouts through ``SGLangClient``.

The converted folder is the model path, with the CPU recipe of
``tests/real_engines/sglang/_launch.py`` (``SGLANG_USE_CPU_ENGINE=1`` included: without it
the scheduler dies on SmolLM2's rotary embedding). Greedy, so the model's turns are the
same each run: the plain problems get an answer, the conversation that ends with a tool
result gets its continuation after the tool turn, and the follow-up question after a
calculator exchange gets a call of the model's own, so the runner appends a tool turn
(measured with 40 new tokens; 36 are the call's). Every trajectory must equal a fresh
render of its messages with toolrollout's ``smollm2`` template and the real tokenizer.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.chat.families.conftest import fresh_render_ids
from tests.real_engines.sglang._launch import LIMIT, SGLangServer, require_sglang, sglang_server

from toolrollout.engines import SamplingParams, SGLangClient
from toolrollout.rollout import RolloutConfig, RolloutRunner, Trajectory
from toolrollout.tools import calculator_tool

pytestmark = [pytest.mark.slow, pytest.mark.real_engine, pytest.mark.timeout(LIMIT)]

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
CALL = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        {
            "id": "call_0",
            "type": "function",
            "function": {"name": "calculator", "arguments": json.dumps({"expression": "347 * 29"})},
        }
    ],
}
RESULT = {"role": "tool", "tool_call_id": "call_0", "name": "calculator", "content": "10063"}


def user(question: str) -> dict[str, Any]:
    return {"role": "user", "content": question}


EXCHANGE = [SYSTEM, user("What is 347 * 29?"), CALL, RESULT]
"""A calculator call and its result, already in the prompt."""
CONVERSATIONS = [
    [SYSTEM, user("What is 347 * 29?")],
    [SYSTEM, user("What is 812 * 47?")],
    EXCHANGE,  # continued right after the tool turn
    [*EXCHANGE, {"role": "assistant", "content": "347 * 29 = 10063."}, user("What is 812 * 47?")],
]
IM_END = 2  # SmolLM2's <|im_end|>, the turn's stop token


@pytest.fixture(scope="module")
def sglang_smollm2(
    smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SGLangServer]:
    require_sglang()
    logs = tmp_path_factory.mktemp("sglang-smollm2")
    with sglang_server(logs, dtype="float32", model_path=smollm2_dir) as server:
        yield server


def expected_ids(tokenizer: Any, runner: RolloutRunner, trajectory: Trajectory) -> list[int]:
    """The fresh render; a turn cut at ``max_new_tokens`` lacks the stop token it closes with."""
    ids = fresh_render_ids(tokenizer, runner, trajectory)
    if trajectory.finish_reason == "length":
        assert ids[-1] == IM_END, trajectory.messages[-1]
        ids = ids[:-1]
    return ids


async def test_calculator_rollouts_on_sglang_are_token_exact(
    sglang_smollm2: SGLangServer, smollm2_dir: Path, smollm2_tokenizer: Any
) -> None:
    config = RolloutConfig(
        sampling=SamplingParams(max_new_tokens=40, temperature=0.0), max_turns=2, seed=0
    )
    async with SGLangClient(sglang_smollm2.url) as client:
        assert (await client.info()).model_path == str(smollm2_dir)
        runner = RolloutRunner(client, smollm2_tokenizer, [calculator_tool()], config=config)
        trajectories = await runner.run(CONVERSATIONS)
    assert runner.chat.family.name == "smollm2"
    summary = [(t.status, t.finish_reason, t.num_tool_calls, t.error) for t in trajectories]
    assert not any(t.failed for t in trajectories), summary
    for t in trajectories:
        assert t.metrics["drift_mismatches"] == 0, t.metrics.get("drift_reports")
        ids = [*t.prompt_ids, *t.response_ids]
        assert ids == expected_ids(smollm2_tokenizer, runner, t), smollm2_tokenizer.decode(ids)
        # the engine's logprobs: one per model token, none for the tool turns' tokens
        mask = t.loss_mask
        model = [lp for lp, m in zip(t.rollout_logprobs, mask, strict=True) if m]
        assert len(model) == sum(mask) > 0
        assert all(math.isfinite(lp) and lp <= 0.0 for lp in model) and min(model) < 0.0
        for span in t.spans:
            if span.kind == "model":
                assert span.logprob_array is not None
                assert len(span.logprob_array) == span.num_tokens
            else:
                assert span.logprob_array is None
        # and each engine answer's tokens are exactly the model tokens
        answered = [i for start, end, _ in t.weight_segments for i in range(start, end)]
        assert answered == [i for i, m in enumerate(mask) if m]
    # the follow-up question's answer is a calculator call: a tool turn inside the run
    called = trajectories[3]
    assert called.num_tool_calls >= 1 and called.parse_errors == 0, summary
    appended = called.messages[len(CONVERSATIONS[3]) :]
    assert [m["content"] for m in appended if m["role"] == "tool"][:1] == ["38164"], appended
