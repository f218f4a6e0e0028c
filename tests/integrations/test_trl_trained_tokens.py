"""TRL: the extras describe the tokens the trainer trains, and the sampling it assumes.

The scripted engine answers one calculator call, then ``The answer is 1364.``. A completion
cut by the trainer's ``max_completion_length`` must carry extras of the kept tokens only
(a reward computed from the whole trajectory would score text the policy never sees); by
default the rollout's budget follows that limit so nothing is cut at all; and a sampling
setting that differs from the trainer's is refused in one line.
"""

from __future__ import annotations

import re
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest

from toolrollout import RolloutConfig, SamplingParams, UserError
from toolrollout.integrations import trl_rollout_func
from toolrollout.spec import RunSpec
from toolrollout.testing import ScriptedEngine
from toolrollout.tools import calculator_tool

PROMPT = [{"role": "user", "content": "Multiply 4 by 341."}]

CALCULATOR = RunSpec(tools=[calculator_tool()])


def _trainer(limit: int | None, **sampling: Any) -> Any:
    return SimpleNamespace(
        args=SimpleNamespace(max_completion_length=limit, **sampling),
        model=SimpleNamespace(training=True),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
    )


def _numeric_reward(final_answer: list[str], answer: list[str], **_: Any) -> list[float]:
    """The documented reward: the last number of the final answer equals the truth."""
    out = []
    for text, truth in zip(final_answer, answer, strict=True):
        numbers = re.findall(r"-?\d+(?:\.\d+)?", text.replace(",", ""))
        out.append(float(bool(numbers) and float(numbers[-1]) == float(truth)))
    return out


def _spans(scripted_engine: ScriptedEngine, demo_tokenizer: Any) -> list[tuple[str, int]]:
    """(kind, length) of each span of the uncut trajectory."""
    with trl_rollout_func(scripted_engine, demo_tokenizer, CALCULATOR) as rollout:
        rollout([PROMPT], _trainer(None))
        (trajectory,) = rollout.last_trajectories
    assert trajectory.status == "completed" and trajectory.num_tool_calls == 1
    return [(span.kind, len(span.ids)) for span in trajectory.spans]


def _cut(engine: ScriptedEngine, tokenizer: Any, limit: int) -> dict[str, Any]:
    with trl_rollout_func(engine, tokenizer, CALCULATOR, response_budget="config") as rollout:
        out = rollout([PROMPT], _trainer(limit))
    assert len(out["completion_ids"][0]) == limit
    return {key: value[0] for key, value in out.items()}


def test_a_cut_inside_the_answer_scores_only_the_kept_text(
    scripted_engine: ScriptedEngine, demo_tokenizer: Any
) -> None:
    spans = _spans(scripted_engine, demo_tokenizer)
    whole = sum(n for _, n in spans)
    answer_tokens = len(demo_tokenizer.encode("1364.", add_special_tokens=False))
    # Cut the answer turn before its number: EOS, ".", and the digits are dropped.
    out = _cut(scripted_engine, demo_tokenizer, whole - 1 - answer_tokens)
    assert out["status"] == "truncated"
    assert out["finish_reason"] == "max_completion_length"
    assert out["final_answer"] == "The answer is"
    assert out["num_turns"] == 2 and out["num_tool_calls"] == 1
    assert out["reward"] is None  # toolrollout's reward scored the whole trajectory
    assert _numeric_reward([out["final_answer"]], ["1364"]) == [0.0]
    # Kept up to the number: the answer text is what the policy wrote, and scores.
    out = _cut(scripted_engine, demo_tokenizer, whole - 1)
    assert out["final_answer"] == "The answer is 1364."
    assert _numeric_reward([out["final_answer"]], ["1364"]) == [1.0]


def test_a_cut_before_the_answer_leaves_no_answer(
    scripted_engine: ScriptedEngine, demo_tokenizer: Any
) -> None:
    spans = _spans(scripted_engine, demo_tokenizer)
    (first, call_len), (kind, tool_len) = spans[0], spans[1]
    assert (first, kind) == ("model", "tool")
    # Inside the tool result: the call was kept (and counts), the answer turn was not.
    out = _cut(scripted_engine, demo_tokenizer, call_len + tool_len // 2)
    assert out["num_turns"] == 1 and out["num_tool_calls"] == 1
    assert "1364" not in out["final_answer"]
    assert out["turn_rewards"] == [None] and len(out["weight_versions"]) == 1
    # Inside the call itself: a half-written call is no call.
    out = _cut(scripted_engine, demo_tokenizer, call_len // 2)
    assert out["num_turns"] == 1 and out["num_tool_calls"] == 0
    assert out["status"] == "truncated"


def test_the_rollout_budget_follows_the_trainers_completion_limit(
    scripted_engine: ScriptedEngine, demo_tokenizer: Any
) -> None:
    spans = _spans(scripted_engine, demo_tokenizer)
    limit = spans[0][1] + spans[1][1] + 3  # three tokens into the answer turn
    with trl_rollout_func(scripted_engine, demo_tokenizer, CALCULATOR) as rollout:
        out = rollout([PROMPT], _trainer(limit))
        (trajectory,) = rollout.last_trajectories
    # toolrollout's own loop stopped at the limit: nothing was generated past it.
    assert len(trajectory.response_ids) <= limit
    assert out["completion_ids"][0] == trajectory.response_ids
    assert out["status"] == ["truncated"]
    assert out["finish_reason"][0] in {"length", "max_response_tokens"}  # the budget's ends
    assert out["num_tool_calls"] == [1]


@pytest.mark.parametrize(
    ("ours", "theirs", "named"),
    [
        ({"temperature": 0.7}, {"temperature": 1.0}, "temperature=0.7 .* args.temperature=1"),
        ({"top_p": 0.9}, {"top_p": 1.0}, "top_p=0.9 .* args.top_p=1"),
        ({"top_k": 50}, {"top_k": 0}, "top_k=50 .* args.top_k=0"),
    ],
)
def test_a_sampling_mismatch_is_one_line_naming_both_values(
    scripted_engine: ScriptedEngine,
    demo_tokenizer: Any,
    ours: dict[str, Any],
    theirs: dict[str, Any],
    named: str,
) -> None:
    config = RolloutConfig(sampling=SamplingParams(max_new_tokens=64, **ours))
    rollout = trl_rollout_func(scripted_engine, demo_tokenizer, CALCULATOR.replace(config=config))
    with rollout, pytest.raises(UserError, match=named) as caught:
        rollout(
            [PROMPT], _trainer(None, **{"temperature": 1.0, "top_p": 1.0, "top_k": 0, **theirs})
        )
    assert "\n" not in str(caught.value)


def test_matching_sampling_passes_with_each_sides_way_of_saying_off(
    scripted_engine: ScriptedEngine, demo_tokenizer: Any
) -> None:
    config = RolloutConfig(sampling=SamplingParams(max_new_tokens=64, temperature=0.9))
    rollout = trl_rollout_func(scripted_engine, demo_tokenizer, CALCULATOR.replace(config=config))
    with rollout:  # top_k -1 here, 0 in TRL; min_p 0.0 here, None in TRL: both mean off
        out = rollout([PROMPT], _trainer(None, temperature=0.9, top_p=1.0, top_k=0, min_p=None))
    assert out["status"] == ["completed"]
    # One weight version per engine answer (the call turn and the answer turn).
    assert out["weight_versions"] == [[out["weight_version"][0]] * 2]


def test_mask_truncated_completions_masks_every_truncated_rollout(
    scripted_engine: ScriptedEngine, demo_tokenizer: Any
) -> None:
    """TRL's option sees only a last token that is not EOS; the adapter masks the rest."""
    call_len = _spans(scripted_engine, demo_tokenizer)[0][1]
    # The budget ends right after the call turn (its EOS kept): the tool result does not fit.
    trainer = _trainer(call_len + 2, mask_truncated_completions=True)
    with trl_rollout_func(scripted_engine, demo_tokenizer, CALCULATOR) as rollout:
        out = rollout([PROMPT], trainer)
    assert out["status"] == ["truncated"]
    assert out["completion_ids"][0][-1] == demo_tokenizer.eos_token_id  # TRL would train it
    assert not any(out["env_mask"][0])
    with trl_rollout_func(scripted_engine, demo_tokenizer, CALCULATOR) as rollout:
        out = rollout([PROMPT], _trainer(call_len + 2))
    assert any(out["env_mask"][0])  # without the option, the model tokens are trained
