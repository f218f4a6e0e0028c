"""Qwen3 end to end with its official templates, thinking on and off.

Rules under test:

- thinking on, one user query: the template re-renders every think block after the last
  query from ``reasoning_content``, so the transcript equals a fresh render exactly;
- thinking off (``chat_template_kwargs={"enable_thinking": False}``): every generation
  prompt holds an empty ``<think>\\n\\n</think>\\n\\n`` that a later render keeps only for
  the final turn. That is the family's documented rewrite: ``drift_expected`` counts it,
  ``drift_mismatches`` stays 0, and the transcript equals a fresh render once think blocks
  are dropped from both (the family's history normalizer);
- thinking on, a second user query (an interaction): the turns before it lose their think
  blocks on re-render, the same documented rewrite.

Both the template Qwen3 shipped with and its later revision (list content tolerated) run.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import pytest
from tests.chat.families.conftest import fresh_render_ids, run_family
from tests.chat.families.qwen_common import TOOLS, fresh_official_ids, qwen_tokenizer, transcript
from transformers import PreTrainedTokenizerBase

from toolrollout.chat import ChatFormat
from toolrollout.chat.families import get_template_family
from toolrollout.interactions import Interaction, InteractionReply
from toolrollout.rollout import RolloutConfig, RolloutRunner, TrajectoryStatus
from toolrollout.testing import ScriptedEngine, ScriptedOutput

TEMPLATES = ["Qwen-Qwen3-0.6B.jinja", "trl-qwen3.jinja"]
PROMPT = [
    {"role": "system", "content": "You are a careful assistant."},
    {"role": "user", "content": "What is 2 + 3, and the weather in Paris?"},
]
WEATHER = "Paris: sunny, 21 C\nwind: 5 km/h from the west\nhumidity: 40%"


def hermes(name: str, **arguments: object) -> str:
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


CALLS_1 = hermes("add", a=2, b=3) + "\n" + hermes("get_weather", city="Paris")
CALLS_2 = hermes("add", a=5, b=1)
ANSWER = "2 + 3 = 5 (plus one is 6), and Paris is sunny."

THINKING = [
    "<think>\nI need the sum and the weather.\n</think>\n\nLet me look both up.\n"
    + CALLS_1
    + "<|im_end|>",
    "<think>\nNow add one to the sum.\n</think>\n\n" + CALLS_2 + "<|im_end|>",
    "<think>\nAll facts are in.\n</think>\n\n" + ANSWER + "<|im_end|>",
]
NOT_THINKING = [
    "Let me look both up.\n" + CALLS_1 + "<|im_end|>",
    CALLS_2 + "<|im_end|>",
    ANSWER + "<|im_end|>",
]


@pytest.fixture(scope="module", params=TEMPLATES)
def tokenizer(request: pytest.FixtureRequest) -> PreTrainedTokenizerBase:
    return qwen_tokenizer(request.param, qwen3=True)


def test_detected_from_the_official_template(tokenizer: PreTrainedTokenizerBase) -> None:
    assert ChatFormat(tokenizer).family.name == "qwen3"
    off = ChatFormat(tokenizer, template_kwargs={"enable_thinking": False})
    assert off.family.name == "qwen3"


def test_thinking_on_is_token_exact(tokenizer: PreTrainedTokenizerBase) -> None:
    runner, trajectory, _ = run_family(tokenizer, TOOLS, THINKING, PROMPT)
    assert runner.chat.family.name == "qwen3"
    assert trajectory.status is TrajectoryStatus.COMPLETED, trajectory.error
    assert trajectory.num_tool_calls == 3 and trajectory.parse_errors == 0
    assert trajectory.metrics["drift_mismatches"] == 0
    assert trajectory.metrics["drift_expected"] == 0
    assistants = [m for m in trajectory.messages if m["role"] == "assistant"]
    assert [m["reasoning_content"] for m in assistants] == [
        "I need the sum and the weather.",
        "Now add one to the sum.",
        "All facts are in.",
    ]
    assert [m["content"] for m in assistants] == ["Let me look both up.", "", ANSWER]
    assert [m["content"] for m in trajectory.messages if m["role"] == "tool"] == [
        "5",
        WEATHER,
        "6",
    ]
    assert transcript(trajectory) == fresh_official_ids(tokenizer, trajectory, runner.chat.tools)
    assert transcript(trajectory) == fresh_render_ids(tokenizer, runner, trajectory)


def test_thinking_off_empty_think_is_the_documented_rewrite(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    config = RolloutConfig(chat_template_kwargs={"enable_thinking": False})
    runner, trajectory, engine = run_family(tokenizer, TOOLS, NOT_THINKING, PROMPT, config=config)
    assert trajectory.status is TrajectoryStatus.COMPLETED, trajectory.error
    assert trajectory.num_tool_calls == 3 and trajectory.parse_errors == 0
    # Every prompt the engine saw ends with the empty think block of thinking-off mode.
    empty = tokenizer.encode("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert all(list(r.input_ids[-len(empty) :]) == empty for r in engine.requests)
    assert trajectory.metrics["drift_mismatches"] == 0
    assert trajectory.metrics["drift_expected"] >= 1
    assert all("reasoning_content" not in m for m in trajectory.messages)
    # The official template, given the thinking-off kwarg, renders the empty block only
    # for the last turn: not a prefix of the transcript, equal once blocks are dropped.
    text = tokenizer.apply_chat_template(
        list(trajectory.messages),
        tools=list(runner.chat.tools),
        tokenize=False,
        enable_thinking=False,
    )
    assert isinstance(text, str)
    fresh = text.removesuffix("\n")
    sampled = str(tokenizer.decode(transcript(trajectory)))
    assert sampled != fresh
    normalize = runner.chat.family.history_normalizer
    assert normalize is not None and normalize(sampled) == normalize(fresh)
    assert tokenizer.encode(normalize(sampled)) == tokenizer.encode(normalize(fresh))


def test_malformed_call_is_a_counted_parse_error(tokenizer: PreTrainedTokenizerBase) -> None:
    bad = "<think>\nGo.\n</think>\n\n<tool_call>\n{'name': 'add'}\n</tool_call><|im_end|>"
    _, trajectory, _ = run_family(tokenizer, TOOLS, [bad, "Sorry.<|im_end|>"], PROMPT)
    assert trajectory.parse_errors == 1 and trajectory.num_tool_calls == 0
    assert trajectory.metrics["drift_mismatches"] == 0


def test_dropping_the_normalizer_turns_thinking_off_into_mismatches(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    # Sabotage: without the documented rewrite, the empty think blocks count as drift.
    plain = dataclasses.replace(get_template_family("qwen3"), history_normalizer=None)
    kwargs = {"enable_thinking": False}
    engine = ScriptedEngine(
        [ScriptedOutput(tokenizer.encode(t, add_special_tokens=False)) for t in NOT_THINKING]
    )
    runner = RolloutRunner(
        engine, tokenizer, TOOLS, config=RolloutConfig(chat_template_kwargs=kwargs)
    )
    runner.chat = ChatFormat(
        tokenizer, tools=runner.chat.tools, family=plain, template_kwargs=kwargs
    )
    [trajectory] = anyio.run(runner.run, [PROMPT])
    assert trajectory.num_tool_calls == 3
    assert trajectory.metrics["drift_mismatches"] >= 1


class FollowUp(Interaction):
    """A user who asks one more question, then is satisfied."""

    async def generate_response(
        self, instance_id: str, messages: Sequence[Mapping[str, Any]], **kwargs: Any
    ) -> InteractionReply:
        asked = sum(1 for m in messages if m["role"] == "user")
        return InteractionReply(done=asked > 1, message="And in Rome?")


def test_a_second_user_query_drops_earlier_reasoning_as_documented(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    turns = [
        "<think>\nLook it up.\n</think>\n\n" + hermes("get_weather", city="Paris") + "<|im_end|>",
        "<think>\nSunny.\n</think>\n\nParis is sunny.<|im_end|>",
        "<think>\nNow Rome.\n</think>\n\n" + hermes("get_weather", city="Rome") + "<|im_end|>",
        "<think>\nSunny too.\n</think>\n\nRome is sunny too.<|im_end|>",
    ]
    engine = ScriptedEngine(
        [ScriptedOutput(tokenizer.encode(t, add_special_tokens=False)) for t in turns]
    )
    runner = RolloutRunner(engine, tokenizer, TOOLS, interactions={"followup": FollowUp()})
    row = {"messages": PROMPT, "extra_info": {"interaction_kwargs": {"name": "followup"}}}
    [trajectory] = anyio.run(runner.run, [row])
    assert trajectory.status is TrajectoryStatus.COMPLETED, trajectory.error
    assert trajectory.num_tool_calls == 2 and trajectory.parse_errors == 0
    assert [m["role"] for m in trajectory.messages].count("user") == 2
    # The template keeps reasoning only after the last query: the Paris turns lose theirs.
    assert trajectory.metrics["drift_mismatches"] == 0
    assert trajectory.metrics["drift_expected"] >= 1
    sampled = str(tokenizer.decode(transcript(trajectory)))
    fresh = tokenizer.decode(fresh_official_ids(tokenizer, trajectory, runner.chat.tools))
    assert "Look it up." in sampled and "Look it up." not in fresh
    normalize = runner.chat.family.history_normalizer
    assert normalize is not None and normalize(sampled) == normalize(str(fresh))
