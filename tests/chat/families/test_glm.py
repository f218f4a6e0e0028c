"""GLM-4.5 / GLM-4.6 (``glm45``) with their official templates, through a real runner.

GLM turns have no end token: the model stops at the token that opens the next turn,
``<|observation|>`` after calls and ``<|user|>`` after an answer, and the template writes
``<|observation|>`` itself to open the tool turn. So the tool delta starts right after the
model's stop token, and a fresh render of the messages equals the transcript once the
final stop token (which the template only writes as the next turn's opener) is added.
Argument values carry no type in this format; the tool schemas type them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import pytest
from tests.chat.families.conftest import (
    build_tokenizer,
    fresh_render_ids,
    official_template,
    run_family,
)

from toolrollout.chat import ChatFormat
from toolrollout.chat.families import get_template_family
from toolrollout.interactions import Interaction, InteractionReply
from toolrollout.rollout import RolloutConfig, RolloutRunner, TrajectoryStatus
from toolrollout.testing import ScriptedEngine, ScriptedOutput
from toolrollout.tools import Tool, function_tool

TEMPLATES = ["trl-glm4moe.jinja", "GLM-4.6.jinja"]
SPECIAL = [
    "<|endoftext|>",
    "[MASK]",
    "[gMASK]",
    "[sMASK]",
    "<sop>",
    "<eop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "/nothink",
]


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def note(text: str, tags: list[str]) -> str:
    """Store a note."""
    assert isinstance(text, str) and isinstance(tags, list)  # typed by the schema
    return f"stored {text!r}\ntags: {', '.join(tags)}\nok"


TOOLS: list[Tool] = [function_tool(add), function_tool(note)]
PROMPT: list[dict[str, Any]] = [
    {"role": "system", "content": "You are careful."},
    {"role": "user", "content": "Add 2 and 3, then note the sum."},
]


def call(name: str, **arguments: str) -> str:
    pairs = "".join(
        f"<arg_key>{key}</arg_key>\n<arg_value>{value}</arg_value>\n"
        for key, value in arguments.items()
    )
    return f"\n<tool_call>{name}\n{pairs}</tool_call>"


def turns(thinking: bool) -> list[str]:
    def think(text: str) -> str:
        return f"\n<think>{text}</think>" if thinking else ""

    return [
        think("Two calls at once.")
        + "\nLet me check."
        + call("add", a="2", b="3")
        + call("note", text="5", tags='["sum", "math"]')
        + "<|observation|>",
        think("Check again.") + call("add", a="5", b="0") + "<|observation|>",
        think("Done.") + "\n2 + 3 = 5, noted.<|user|>",
    ]


def tokenizer_for(template: str) -> Any:
    return build_tokenizer(
        special=SPECIAL, added=[], template=official_template(template), eos="<|endoftext|>"
    )


@pytest.fixture(scope="module", params=TEMPLATES)
def tokenizer(request: pytest.FixtureRequest) -> Any:
    return tokenizer_for(request.param)


def test_detected_without_family(tokenizer: Any) -> None:
    assert ChatFormat(tokenizer).family.name == "glm45"


@pytest.mark.parametrize("thinking", [True, False])
def test_runner_round_trip(tokenizer: Any, thinking: bool) -> None:
    kwargs = {} if thinking else {"enable_thinking": False}
    config = RolloutConfig(chat_template_kwargs=kwargs)
    runner, trajectory, _ = run_family(tokenizer, TOOLS, turns(thinking), PROMPT, config=config)
    assert runner.chat.family.name == "glm45" and runner.parser.name == "glm45"
    assert trajectory.status is TrajectoryStatus.COMPLETED, trajectory.error
    assert trajectory.num_tool_calls == 3 and trajectory.parse_errors == 0
    assert trajectory.tool_errors == 0
    assert trajectory.metrics["drift_mismatches"] == 0
    assert trajectory.metrics["drift_expected"] == 0
    messages = list(trajectory.messages)
    tools = [m for m in messages if m["role"] == "tool"]
    assert [m["content"] for m in tools] == ["5", "stored '5'\ntags: sum, math\nok", "5"]
    first = messages[2]
    assert first["tool_calls"][1]["function"]["arguments"] == {"text": "5", "tags": ["sum", "math"]}
    assert first["content"] == "Let me check."
    assert first.get("reasoning_content") == ("Two calls at once." if thinking else None)

    # The fresh render plus the final stop token (the next turn's opener) is the transcript.
    ids = [*trajectory.prompt_ids, *trajectory.response_ids]
    user = tokenizer.convert_tokens_to_ids("<|user|>")
    assert ids[-1] == user
    assert [*fresh_render_ids(tokenizer, runner, trajectory), user] == ids
    # Every tool delta starts right after the model's <|observation|>, never repeating it.
    observation = tokenizer.convert_tokens_to_ids("<|observation|>")
    assert ids.count(observation) == 2
    tool_spans = [span for span in trajectory.spans if span.kind == "tool"]
    assert all(observation not in span.ids for span in tool_spans)


class FollowUp(Interaction):
    """A user who asks one more question, then is satisfied."""

    async def generate_response(
        self, instance_id: str, messages: Sequence[Mapping[str, Any]], **kwargs: Any
    ) -> InteractionReply:
        asked = sum(1 for m in messages if m["role"] == "user")
        return InteractionReply(done=asked > 1, message="And 5 + 1?")


@pytest.mark.parametrize("thinking", [True, False])
def test_a_user_follow_up_rewrites_earlier_reasoning_as_documented(
    tokenizer: Any, thinking: bool
) -> None:
    def think(text: str) -> str:
        return f"\n<think>{text}</think>" if thinking else ""

    texts = [
        think("Add first.") + call("add", a="2", b="3") + "<|observation|>",
        think("It is 5.") + "\n2 + 3 = 5.<|user|>",
        think("Add again.") + call("add", a="5", b="1") + "<|observation|>",
        think("It is 6.") + "\n5 + 1 = 6.<|user|>",
    ]
    engine = ScriptedEngine(
        [ScriptedOutput(tokenizer.encode(t, add_special_tokens=False)) for t in texts]
    )
    kwargs = {} if thinking else {"enable_thinking": False}
    runner = RolloutRunner(
        engine,
        tokenizer,
        TOOLS,
        config=RolloutConfig(chat_template_kwargs=kwargs),
        interactions={"followup": FollowUp()},
    )
    row = {"messages": PROMPT, "extra_info": {"interaction_kwargs": {"name": "followup"}}}
    [trajectory] = anyio.run(runner.run, [row])
    assert trajectory.status is TrajectoryStatus.COMPLETED, trajectory.error
    assert trajectory.num_tool_calls == 2 and trajectory.tool_errors == 0
    assert [m["role"] for m in trajectory.messages].count("user") == 2
    assert trajectory.metrics["drift_mismatches"] == 0
    ids = [*trajectory.prompt_ids, *trajectory.response_ids]
    user = tokenizer.convert_tokens_to_ids("<|user|>")
    fresh = [*fresh_render_ids(tokenizer, runner, trajectory), user]
    if not thinking:  # nothing to empty: token-exact
        assert trajectory.metrics["drift_expected"] == 0
        assert fresh == ids
        return
    # The template empties the reasoning before the last user message; the transcript keeps
    # what the model saw, and the difference is the documented rewrite, counted as expected.
    assert trajectory.metrics["drift_expected"] >= 1
    sampled, rendered = runner.chat.decode(ids), runner.chat.decode(fresh)
    assert "It is 5." in sampled and "It is 5." not in rendered
    normalize = runner.chat.family.history_normalizer
    assert normalize is not None and normalize(sampled) == normalize(rendered)


def test_malformed_call_is_a_counted_error(tokenizer: Any) -> None:
    bad = "\n<think>x</think>\n<tool_call>add\n<arg_key>a</arg_key>\n2\n</tool_call><|observation|>"
    _, trajectory, _ = run_family(tokenizer, TOOLS, [bad, "\nSorry.<|user|>"], PROMPT)
    assert trajectory.parse_errors == 1 and trajectory.num_tool_calls == 0
    tool = trajectory.messages[3]
    assert tool["role"] == "tool" and "<arg_value>" in tool["content"]


def test_breaking_the_rules_fails() -> None:
    tokenizer = tokenizer_for(TEMPLATES[0])
    # Without the opener rule the delta would be looked for after a stop token that the
    # render of the conversation so far does not hold.
    family = dataclasses.replace(get_template_family("glm45"), stop_opens_next_turn=False)
    _, trajectory, _ = run_family(
        tokenizer, TOOLS, turns(True), PROMPT, config=RolloutConfig(family=family)
    )
    assert trajectory.status is TrajectoryStatus.FAILED
    assert "TokenizationError" in (trajectory.error or "")
    # The Qwen parser shares the <tool_call> tag but reads JSON: every call is an error.
    _, trajectory, _ = run_family(
        tokenizer, TOOLS, turns(True), PROMPT, config=RolloutConfig(tool_parser="hermes")
    )
    assert trajectory.num_tool_calls == 0 and trajectory.parse_errors == 3
