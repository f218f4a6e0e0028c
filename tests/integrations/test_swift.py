"""ms-swift: the scheduler loads as an external plugin and returns what ms-swift's trainer reads.

Checked with ms-swift's own pieces: its plugin loader (``import_external_file``), its
``multi_turns`` registry, its ``RolloutInferRequest`` / ``RequestConfig`` / ``RolloutOutput``
models, its GRPO trainer's per-sample record (``GRPOSample``: request built by
``to_infer_request``, rollout merged by ``apply_rollout_output``) and the two trainer helpers
that consume a rollout (``replace_assistant_response_with_ids`` and ``build_rollout_logps``).
The engine behind the scheduler is the scripted test engine (the documented seam), so the
tool call is certain.
"""

from __future__ import annotations

import copy
from typing import Any

import anyio
import pytest
import torch
from swift.infer_engine.protocol import (
    RequestConfig,
    RolloutInferRequest,
    RolloutOutput,
)
from swift.rl_core.data import GRPOSample
from swift.rlhf_trainers.utils import (
    build_rollout_logps,
    replace_assistant_response_with_ids,
)
from swift.rollout.multi_turn import multi_turns
from swift.utils import import_external_file

from toolrollout import UserError
from toolrollout.integrations import SWIFT_PLUGIN_PATH
from toolrollout.integrations._swift import to_swift_rollout_output
from toolrollout.testing import ScriptedEngine
from toolrollout.tools import calculator_tool

PROMPT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Multiply 4 by 341."},
]


def test_external_plugin_registers_the_scheduler() -> None:
    import_external_file(str(SWIFT_PLUGIN_PATH))
    assert multi_turns["toolrollout"].__name__ == "ToolRolloutScheduler"
    # ms-swift puts the plugin's folder on sys.path: nothing there may shadow a package.
    assert sorted(p.name for p in SWIFT_PLUGIN_PATH.parent.glob("*.py")) == ["swift_plugin.py"]


def _scheduler(engine: Any, tokenizer: Any) -> Any:
    import_external_file(str(SWIFT_PLUGIN_PATH))
    return multi_turns["toolrollout"](
        infer_engine=None,
        max_turns=3,
        tokenizer=tokenizer,
        engine=engine,
        tools=[calculator_tool()],
    )


def test_run_returns_token_ids_loss_mask_and_logprobs(
    scripted_engine: ScriptedEngine, demo_tokenizer: Any
) -> None:
    scheduler = _scheduler(scripted_engine, demo_tokenizer)
    request = RolloutInferRequest(
        messages=[*copy.deepcopy(PROMPT), {"role": "assistant", "content": None}],
        data_dict={"solution": "1364"},
    )
    out = anyio.run(scheduler.run, request, RequestConfig(max_tokens=96, temperature=1.0))
    assert isinstance(out, RolloutOutput)
    assert callable(to_swift_rollout_output)
    # The rollout server sends it as JSON; ms-swift's model reads it back unchanged.
    out = RolloutOutput.model_validate(out.model_dump())

    assert len(out.response_token_ids) == len(out.response_loss_mask) == 1
    ids, mask = out.response_token_ids[0], out.response_loss_mask[0]
    assert len(ids) == len(mask)
    tool_text = demo_tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m == 0])
    model_text = demo_tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m == 1])
    assert "<tool_response>" in tool_text and "1364" in tool_text
    assert "<tool_call>" in model_text and "<tool_response>" not in model_text
    # rollout_logprobs: one value per loss-mask-1 token, the engine's, in order.
    assert len(out.rollout_logprobs) == 1 and len(out.rollout_logprobs[0]) == sum(mask)
    assert all(lp < 0 for lp in out.rollout_logprobs[0])
    assert out.messages is not None and out.messages[:2] == PROMPT
    assert out.messages[-1]["role"] == "assistant"
    assert out.response.choices[0].token_ids == ids
    assert out.rollout_infos["num_turns"] == 2
    assert out.rollout_infos["tool_stats"]["calculator"]["calls"] == 1
    assert out.rollout_infos["final_answer"] == "The answer is 1364."

    # What ms-swift's trainer does with it: ids replace the assistant content...
    replaced = replace_assistant_response_with_ids(
        copy.deepcopy(out.messages), out.response_token_ids, out.response_loss_mask
    )
    assert replaced[-1]["content"] == {"token_ids": ids, "loss_scale": mask}
    # ...and the logprobs land on exactly the trained positions.
    completion_mask = torch.tensor([mask])
    logps = build_rollout_logps([out.rollout_logprobs], completion_mask, torch.device("cpu"))
    assert logps is not None
    trained = logps[0][completion_mask[0] == 1].tolist()
    assert trained == pytest.approx(out.rollout_logprobs[0])


def test_grpo_sample_takes_the_rollout_as_ms_swifts_trainer_does(
    scripted_engine: ScriptedEngine, demo_tokenizer: Any
) -> None:
    """A dataset row through ms-swift's own sample lifecycle, the scheduler in the middle."""
    scheduler = _scheduler(scripted_engine, demo_tokenizer)
    row = {"messages": copy.deepcopy(PROMPT), "solution": "1364", "request_id": "req-0"}
    sample = GRPOSample.from_row(row)
    # Multi-turn schedulers get the dataset columns (ms-swift's samples2requests does this).
    request = sample.to_infer_request(include_extra=True)
    assert request.data_dict == {"solution": "1364"}
    out = anyio.run(scheduler.run, request, RequestConfig(max_tokens=96, temperature=1.0))
    sample.apply_rollout_output(rollout_output=RolloutOutput.model_validate(out.model_dump()))

    assert sample.messages[:2] == PROMPT and sample.messages[-1]["role"] == "assistant"
    assert sample.finish_reason == "stop" and not sample.is_truncated
    (ids,), (mask,) = sample.response_token_ids, sample.response_loss_mask
    tool_text = demo_tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m == 0])
    assert "<tool_response>" in tool_text and "1364" in tool_text
    assert sample.rollout_infos["num_tool_calls"] == 1
    assert sample.to_reward_row()["solution"] == "1364"  # what reward functions receive
    # encode_sample's step: the ids replace the assistant message, loss mask as loss_scale.
    replaced = replace_assistant_response_with_ids(
        [dict(m) for m in sample.messages], sample.response_token_ids, sample.response_loss_mask
    )
    assert replaced[-1]["content"] == {"token_ids": ids, "loss_scale": mask}
    completion_mask = torch.tensor([mask])
    logps = build_rollout_logps([sample.rollout_logprobs], completion_mask, torch.device("cpu"))
    assert logps is not None
    trained = logps[0][completion_mask[0] == 1].tolist()
    assert trained == pytest.approx(sample.rollout_logprobs[0])
    assert torch.all(logps[0][completion_mask[0] == 0] == 0)


def test_missing_engine_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, demo_tokenizer: Any
) -> None:
    monkeypatch.delenv("TOOLROLLOUT_ENGINE_URL", raising=False)
    import_external_file(str(SWIFT_PLUGIN_PATH))
    scheduler = multi_turns["toolrollout"](
        infer_engine=None, tokenizer=demo_tokenizer, tools=[calculator_tool()]
    )
    request = RolloutInferRequest(messages=copy.deepcopy(PROMPT))
    with pytest.raises(UserError, match="TOOLROLLOUT_ENGINE_URL"):
        anyio.run(scheduler.run, request, RequestConfig(max_tokens=32))


def test_family_and_template_kwargs_from_the_environment(
    scripted_engine: ScriptedEngine, demo_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # swift rollout's CLI cannot pass keyword arguments: the environment names the family.
    monkeypatch.setenv("TOOLROLLOUT_FAMILY", "qwen3")
    monkeypatch.setenv("TOOLROLLOUT_CHAT_TEMPLATE_KWARGS", '{"enable_thinking": false}')
    runner = _scheduler(scripted_engine, demo_tokenizer)._runner(RequestConfig(max_tokens=32))
    assert runner.chat.family.name == "qwen3"  # named, though the demo template is qwen25
    assert runner.chat.template_kwargs == {"enable_thinking": False}
    assert runner.parser is not None
    monkeypatch.setenv("TOOLROLLOUT_CHAT_TEMPLATE_KWARGS", "[1]")
    with pytest.raises(UserError, match="TOOLROLLOUT_CHAT_TEMPLATE_KWARGS must be a JSON object"):
        _scheduler(scripted_engine, demo_tokenizer)
