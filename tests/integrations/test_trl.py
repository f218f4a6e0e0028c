"""TRL: the rollout_func contract, then real GRPOTrainer optimizer steps on toolrollout rollouts."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest

from toolrollout import RolloutConfig, SamplingParams, UserError
from toolrollout.apps.demo import DEMO_MODEL_PATH, load_demo_prompts
from toolrollout.integrations import TRLRolloutFunc, trl_rollout_func
from toolrollout.spec import RunSpec
from toolrollout.testing import ScriptedEngine
from toolrollout.tools import calculator_tool

PROMPT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Multiply 4 by 341."},
]

CALCULATOR = RunSpec(tools=[calculator_tool()])


def _fake_trainer(max_completion_length: int | None = None) -> Any:
    return SimpleNamespace(
        args=SimpleNamespace(max_completion_length=max_completion_length),
        model=SimpleNamespace(training=True),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
    )


def test_one_completion_per_prompt_with_tool_tokens_masked(
    scripted_engine: ScriptedEngine, demo_tokenizer: Any
) -> None:
    trainer = _fake_trainer()
    with trl_rollout_func(scripted_engine, demo_tokenizer, CALCULATOR) as rollout:
        out = rollout([PROMPT, PROMPT, "What is 2 + 2?"], trainer)
        trajectories = rollout.last_trajectories
    assert scripted_engine.closed  # the rollout function owns the engine's lifecycle
    assert len(out["prompt_ids"]) == len(out["completion_ids"]) == 3
    for i, trajectory in enumerate(trajectories):
        ids, mask, logprobs = out["completion_ids"][i], out["env_mask"][i], out["logprobs"][i]
        assert len(ids) == len(mask) == len(logprobs)
        assert ids == trajectory.response_ids
        assert out["prompt_ids"][i] == list(trajectory.prompt_ids)
        # Exactly the tool span is masked: its decoded text is the tool result turn.
        tool_text = demo_tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m == 0])
        assert "<tool_response>" in tool_text and "1364" in tool_text
        model_text = demo_tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m == 1])
        assert "<tool_call>" in model_text and "<tool_response>" not in model_text
        assert all(lp == 0.0 for lp, m in zip(logprobs, mask, strict=True) if m == 0)
        assert all(lp < 0.0 for lp, m in zip(logprobs, mask, strict=True) if m == 1)
        assert ids[-1] == demo_tokenizer.eos_token_id
    # The string prompt became a user message.
    assert trajectories[2].messages[0] == {"role": "user", "content": "What is 2 + 2?"}
    # Per-sample extras for reward functions, one value per completion.
    assert out["num_turns"] == [2, 2, 2]
    assert out["num_tool_calls"] == [1, 1, 1]
    assert out["tool_stats"][0]["calculator"]["calls"] == 1
    assert out["final_answer"][0] == "The answer is 1364."
    # Batch metrics went into the trainer's log buffers under the shared names.
    assert trainer._metrics["train"]["rollout/num_turns/mean"] == [2.0]
    assert trainer._metrics["train"]["tools/calculator/failure_rate"] == [0.0]
    # ... the names `toolrollout eval` logs; a statistic without data is left out, not NaN
    assert trainer._metrics["train"]["rollout/status/completed"] == [1.0]
    assert "rollout/reward/mean" not in trainer._metrics["train"]  # no reward function ran


def test_completion_is_cut_to_max_completion_length(
    scripted_engine: ScriptedEngine, demo_tokenizer: Any
) -> None:
    with trl_rollout_func(scripted_engine, demo_tokenizer, CALCULATOR) as rollout:
        out = rollout([PROMPT], _fake_trainer(max_completion_length=5))
    assert len(out["completion_ids"][0]) == len(out["env_mask"][0]) == 5


def test_several_samples_per_prompt_is_refused(
    scripted_engine: ScriptedEngine, demo_tokenizer: Any
) -> None:
    with pytest.raises(UserError, match="num_generations"):
        TRLRolloutFunc(
            scripted_engine, demo_tokenizer, CALCULATOR.replace(config=RolloutConfig(n=4))
        )


def _answer_reward(completions: list[Any], answer: list[str], **kwargs: Any) -> list[float]:
    """1 for the right final answer, plus a tie-breaker on the sampled ids.

    The demo model is nearly deterministic; the tie-breaker gives two samples that differ in
    any token different rewards, so GRPO's advantages (and the gradient) are not all zero.
    """
    finals = kwargs["final_answer"]
    ties = [1e-3 * (sum(ids) % 97) for ids in kwargs["completion_ids"]]
    return [float(a in f) + t for f, a, t in zip(finals, answer, ties, strict=True)]


@pytest.mark.slow
def test_grpo_trainer_steps_on_toolrollout_rollouts_without_training_tool_tokens(
    tmp_path: Any, demo_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is "experimental" in TRL
    torch = pytest.importorskip("torch")
    datasets = pytest.importorskip("datasets")
    trl = pytest.importorskip("trl")
    from transformers import AutoModelForCausalLM

    from toolrollout.engines.embedded import EmbeddedEngine

    torch.manual_seed(0)
    rows = load_demo_prompts()[:4]
    dataset = datasets.Dataset.from_list(
        [{"prompt": r["messages"], "answer": r["answer"]} for r in rows]
    )
    model = AutoModelForCausalLM.from_pretrained(str(DEMO_MODEL_PATH), dtype=torch.float32)
    engine = EmbeddedEngine(DEMO_MODEL_PATH, num_threads=1, max_batch_size=8)
    config = RolloutConfig(
        sampling=SamplingParams(max_new_tokens=40, temperature=1.5),
        max_turns=3,
        max_response_tokens=96,
        seed=0,
    )
    rollout = trl_rollout_func(engine, demo_tokenizer, CALCULATOR.replace(config=config))
    returned: list[dict[str, Any]] = []

    def recording_rollout(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        out = rollout(prompts, trainer)
        returned.append(out)
        return out

    seen: list[tuple[Any, Any]] = []

    class RecordingTrainer(trl.GRPOTrainer):  # type: ignore[misc, name-defined]
        def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Any:
            # The exact product TRL uses for the loss: completion_mask * tool_mask.
            mask = inputs["completion_mask"]
            if "tool_mask" in inputs:
                mask = mask * inputs["tool_mask"]
            seen.append((inputs["completion_ids"].clone(), mask.clone()))
            return super()._compute_loss(model, inputs)

    args = trl.GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=96,
        temperature=1.5,  # the rollout's; a mismatch is refused
        max_steps=2,
        learning_rate=1e-3,
        beta=0.0,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=0,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = RecordingTrainer(
        model=model,
        reward_funcs=[_answer_reward],
        args=args,
        train_dataset=dataset,
        processing_class=demo_tokenizer,
        rollout_func=recording_rollout,
    )
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with rollout:
        trainer.train()

    assert trainer.state.global_step == 2
    changed = [n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert changed, "two optimizer steps left every parameter unchanged"
    assert len(returned) >= 2 and len(seen) >= 2

    expected = [
        (ids, mask)
        for out in returned
        for ids, mask in zip(out["completion_ids"], out["env_mask"], strict=True)
    ]
    tool_tokens = sum(len(m) - sum(m) for _, m in expected)
    assert tool_tokens > 0, "no rollout called a tool, so the masking was not exercised"
    assert sum(n for out in returned for n in out["num_tool_calls"]) > 0
    checked = 0
    for completion_ids, loss_mask in seen:
        for row_ids, row_mask in zip(completion_ids.tolist(), loss_mask.tolist(), strict=True):
            match = [m for ids, m in expected if row_ids[: len(ids)] == ids]
            assert match, "a trained completion does not come from the rollout function"
            env_mask = match[0]
            n = len(env_mask)
            # Every tool token has loss mask 0, every model token 1, padding 0.
            assert row_mask[:n] == env_mask
            assert not any(row_mask[n:])
            checked += 1
    assert checked >= 8
    history = [h for h in trainer.state.log_history if "rollout/num_turns/mean" in h]
    assert len(history) == 2
    assert any("tools/calculator/failure_rate" in h for h in history)
