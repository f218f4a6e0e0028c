"""gpt-oss (harmony) end to end: a real RolloutRunner, the official template, real tools.

The engine is the scripted test seam; it answers with what gpt-oss writes (analysis, then
one call on the commentary channel addressed ``to=functions.NAME`` with
``<|constrain|>json``, stopping at ``<|call|>``; a final answer ending ``<|return|>``). The
tokenizer is trained here with harmony's special tokens. The reference for every
comparison is ``tokenizer.apply_chat_template`` on the official template.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest
from tests.chat.families.conftest import build_tokenizer, official_template
from transformers import PreTrainedTokenizerBase

from toolrollout.chat.families._gpt_oss import harmony_history
from toolrollout.integrations import trl_rollout_func
from toolrollout.interactions import GraderInteraction
from toolrollout.rollout import RolloutConfig, RolloutRunner, Trajectory, TrajectoryStatus
from toolrollout.spec import RunSpec
from toolrollout.testing import ScriptedEngine, ScriptedOutput
from toolrollout.tools import Tool, function_tool

HARMONY_SPECIAL = [
    "<|endoftext|>",
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|constrain|>",
    "<|call|>",
    "<|return|>",
]
QUESTION = [{"role": "user", "content": "What is 2 + 3, and what is the weather in Paris?"}]


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def get_weather(city: str) -> str:
    """Current weather in a city, one fact per line."""
    return f"{city}\nSunny\n21 C"


TOOLS: list[Tool] = [function_tool(add), function_tool(get_weather)]


def analysis(text: str) -> str:
    return f"<|channel|>analysis<|message|>{text}<|end|><|start|>assistant"


def call(name: str, arguments: str) -> str:
    """A call as gpt-oss writes it (recipient on the channel, <|constrain|>json)."""
    return (
        f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{arguments}<|call|>"
    )


def final(text: str) -> str:
    return f"<|channel|>final<|message|>{text}<|return|>"


@pytest.fixture(scope="module")
def harmony() -> PreTrainedTokenizerBase:
    return build_tokenizer(
        special=HARMONY_SPECIAL,
        added=[],
        template=official_template("openai-gpt-oss-120b.jinja"),
        eos="<|return|>",
    )


def scripted(tokenizer: PreTrainedTokenizerBase, *texts: str) -> ScriptedEngine:
    outputs = []
    for text in texts:
        ids = list(tokenizer.encode(text, add_special_tokens=False))
        outputs.append(ScriptedOutput(ids, logprobs=[-0.5] * len(ids)))
    return ScriptedEngine(outputs)


async def run(
    tokenizer: PreTrainedTokenizerBase, *texts: str, **kwargs: Any
) -> tuple[RolloutRunner, Trajectory, ScriptedEngine]:
    engine = scripted(tokenizer, *texts)
    rows = kwargs.pop("rows", [QUESTION])
    runner = RolloutRunner(engine, tokenizer, TOOLS, **kwargs)
    [trajectory] = await runner.run(rows)
    return runner, trajectory, engine


def fresh(runner: RolloutRunner, trajectory: Trajectory, **kwargs: Any) -> str:
    """The official template's render of the trajectory's messages."""
    text = runner.chat.tokenizer.apply_chat_template(
        [dict(m) for m in trajectory.messages],
        tools=list(runner.chat.tools),
        tokenize=False,
        **kwargs,
    )
    assert isinstance(text, str)
    return text


def transcript(runner: RolloutRunner, trajectory: Trajectory) -> str:
    return runner.chat.decode(list(trajectory.prompt_ids) + trajectory.response_ids)


TURNS = (
    analysis("The user wants a sum. Use add.") + call("add", '{"a":2,"b":3}'),
    analysis("Now the weather.") + call("get_weather", '{"city":"Paris"}'),
    analysis("Both results are in.") + final("2 + 3 = 5.\nParis: sunny, 21 C."),
)


async def test_detection_tool_loop_and_history_rule(harmony: PreTrainedTokenizerBase) -> None:
    runner, trajectory, engine = await run(harmony, *TURNS)
    assert runner.chat.family.name == "gpt_oss"  # detected: no family= given
    assert trajectory.status is TrajectoryStatus.COMPLETED, trajectory.error
    assert trajectory.num_tool_calls == 2 and trajectory.tool_errors == 0
    assert trajectory.parse_errors == 0
    # The model's call spelling differs from the template's: expected, not a mismatch.
    assert trajectory.metrics["drift_mismatches"] == 0
    assert trajectory.metrics["drift_expected"] >= 1
    assert runner.chat.windowed_deltas  # each windowed delta equalled the full render's
    assert [span.kind for span in trajectory.spans] == ["model", "tool", "model", "tool", "model"]
    roles = [m["role"] for m in trajectory.messages]
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    first, _, second, weather, last = trajectory.messages[1:]
    assert first["thinking"] == "The user wants a sum. Use add." and first["content"] == ""
    assert first["tool_calls"][0]["function"] == {"name": "add", "arguments": {"a": 2, "b": 3}}
    assert second["tool_calls"][0]["function"]["name"] == "get_weather"
    assert trajectory.messages[2]["content"] == "5"
    assert weather["content"] == "Paris\nSunny\n21 C"  # a multi-line result, run for real
    assert last == {
        "role": "assistant",
        "content": "2 + 3 = 5.\nParis: sunny, 21 C.",
        "thinking": "Both results are in.",
    }
    # The prompt is the official render, token for token, and each request continued the
    # exact transcript.
    prompt = harmony.apply_chat_template(
        list(QUESTION), tools=list(runner.chat.tools), add_generation_prompt=True, return_dict=False
    )
    assert list(trajectory.prompt_ids) == list(prompt)
    spans = trajectory.spans
    assert tuple(engine.requests[2].input_ids) == (
        trajectory.prompt_ids + spans[0].ids + spans[1].ids + spans[2].ids + spans[3].ids
    )
    # The documented rule: equal after harmony_history (analysis dropped once a final answer
    # exists, <|return|> as <|end|>, one spelling of call headers and arguments).
    text, reference = transcript(runner, trajectory), fresh(runner, trajectory)
    assert text != reference
    assert harmony_history(text) == harmony_history(reference)
    assert runner.chat.encode(harmony_history(text)) == runner.chat.encode(
        harmony_history(reference)
    )


async def test_canonical_spelling_is_token_exact(harmony: PreTrainedTokenizerBase) -> None:
    """A model writing the template's own spelling gives a transcript equal to the render."""

    def canonical_call(name: str, arguments: str) -> str:
        return f" to=functions.{name}<|channel|>commentary json<|message|>{arguments}<|call|>"

    turns = (
        "<|channel|>analysis<|message|>Sum.<|end|><|start|>assistant"
        + canonical_call("add", '{"a": 2, "b": 3}'),
        canonical_call("get_weather", '{"city": "Paris"}'),
        canonical_call("add", '{"a": 5, "b": 21}'),
    )
    # The third turn is the last one allowed, so its call is not run and no final answer
    # exists: the template keeps every analysis.
    runner, trajectory, _ = await run(harmony, *turns, config=RolloutConfig(max_turns=3))
    assert trajectory.num_tool_calls == 2 and trajectory.parse_errors == 0
    assert trajectory.metrics["drift_mismatches"] == trajectory.metrics["drift_expected"] == 0
    ids = list(trajectory.prompt_ids) + trajectory.response_ids
    last_is_tool = trajectory.messages[-1]["role"] == "tool"
    reference = harmony.apply_chat_template(
        [dict(m) for m in trajectory.messages],
        tools=list(runner.chat.tools),
        add_generation_prompt=last_is_tool,
        return_dict=False,
    )
    assert ids == list(reference)


async def test_follow_up_user_turn_after_a_final_answer(
    harmony: PreTrainedTokenizerBase,
) -> None:
    """A grader's retry after <|return|>: the delta starts after the answer's history form."""
    row = {
        "messages": QUESTION,
        "answer": "5",
        "extra_info": {"interaction_kwargs": {"name": "grader"}},
    }
    runner, trajectory, _ = await run(
        harmony,
        analysis("Guess.") + final("It is 4."),
        TURNS[0],
        analysis("Got it.") + final("It is 5."),
        rows=[row],
        interactions={"grader": GraderInteraction({"retry_message": "Wrong, try again."})},
    )
    assert trajectory.status is TrajectoryStatus.COMPLETED, trajectory.error
    assert [span.kind for span in trajectory.spans] == [
        "model",
        "interaction",
        "model",
        "tool",
        "model",
    ]
    assert trajectory.num_tool_calls == 1 and trajectory.parse_errors == 0
    assert trajectory.metrics["drift_mismatches"] == 0
    text, reference = transcript(runner, trajectory), fresh(runner, trajectory)
    assert harmony_history(text) == harmony_history(reference)


async def test_malformed_call_is_a_counted_parse_error(harmony: PreTrainedTokenizerBase) -> None:
    runner, trajectory, _ = await run(
        harmony,
        analysis("Sum.") + call("add", '{"a": 2,'),
        analysis("Retry.") + call("add", '{"a":2,"b":3}'),
        final("5"),
    )
    assert trajectory.status is TrajectoryStatus.COMPLETED, trajectory.error
    assert trajectory.parse_errors == 1 and trajectory.num_tool_calls == 1
    assert trajectory.metrics["drift_mismatches"] == 0  # the raw arguments are kept
    error = trajectory.messages[2]
    assert error["role"] == "tool" and "could not parse tool call" in error["content"]
    bad = trajectory.messages[1]["tool_calls"][0]["function"]
    assert bad["name"] == "add"
    assert bad["arguments"] == '{"a": 2,'
    # The messages still render with the official template (the error is the call's answer).
    text, reference = transcript(runner, trajectory), fresh(runner, trajectory)
    assert "<|start|>functions.add to=assistant" in reference
    assert harmony_history(text) == harmony_history(reference)


async def test_family_by_name_and_reasoning_effort(harmony: PreTrainedTokenizerBase) -> None:
    """``family`` and ``chat_template_kwargs`` reach every render (harmony's effort level)."""
    config = RolloutConfig(family="gpt_oss", chat_template_kwargs={"reasoning_effort": "high"})
    runner, trajectory, _ = await run(harmony, TURNS[0], final("5"), config=config)
    assert runner.chat.family.name == "gpt_oss"
    assert trajectory.num_tool_calls == 1 and trajectory.metrics["drift_mismatches"] == 0
    prompt = runner.chat.decode(list(trajectory.prompt_ids))
    assert "Reasoning: high" in prompt and "Reasoning: medium" not in prompt
    reference = fresh(runner, trajectory, reasoning_effort="high")
    assert harmony_history(transcript(runner, trajectory)) == harmony_history(reference)


async def test_two_calls_in_one_turn_are_one_parse_error(harmony: PreTrainedTokenizerBase) -> None:
    """The template renders one call per turn; a turn with two (the stop was ignored) runs none."""
    both = call("add", '{"a":1,"b":1}') + "<|start|>assistant" + call("add", '{"a":2,"b":2}')
    runner, trajectory, _ = await run(harmony, analysis("Two at once.") + both, final("2"))
    assert trajectory.status is TrajectoryStatus.COMPLETED, trajectory.error
    assert trajectory.parse_errors == 1 and trajectory.num_tool_calls == 0
    assert "at most 1 tool call" in trajectory.messages[2]["content"]
    assert "<|start|>functions.add to=assistant" in fresh(runner, trajectory)


def test_trl_rollout_func_with_family(harmony: PreTrainedTokenizerBase) -> None:
    """TRL's rollout_func adapter: family= reaches the run; only model tokens are trained."""
    trainer = SimpleNamespace(
        args=SimpleNamespace(max_completion_length=None),
        model=SimpleNamespace(training=True),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
    )
    engine = scripted(harmony, TURNS[0], analysis("Done.") + final("5"))
    with trl_rollout_func(
        engine, harmony, RunSpec(tools=TOOLS, config=RolloutConfig(family="gpt_oss"))
    ) as rollout:
        out = rollout([QUESTION], trainer)
        [trajectory] = rollout.last_trajectories
    assert rollout.runner.chat.family.name == "gpt_oss"
    assert out["num_tool_calls"] == [1] and trajectory.parse_errors == 0
    ids, mask = out["completion_ids"][0], out["env_mask"][0]
    tool_text = harmony.decode([t for t, m in zip(ids, mask, strict=True) if m == 0])
    result = '<|start|>functions.add to=assistant<|channel|>commentary<|message|>"5"<|end|>'
    assert tool_text == result + "<|start|>assistant"
    model_text = harmony.decode([t for t, m in zip(ids, mask, strict=True) if m == 1])
    assert model_text == TURNS[0] + analysis("Done.") + final("5")
