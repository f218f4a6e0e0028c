"""Mistral Nemo 2407 and Small 3.1 / 3.2 with their official templates, end to end.

The templates are vendored byte-identical (tests/chat/templates/official); the tokenizer is
trained here with Mistral's control tokens. Each scripted model turn is written the way
its template renders an assistant turn: Nemo ``[TOOL_CALLS][{..., "id": ...}]``, Small 3.1
``[TOOL_CALLS] [...]``, Small 3.2 ``[TOOL_CALLS]name[CALL_ID]id[ARGS]{...}``, then ``</s>``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import pytest
from tests.chat.conftest import build_tokenizer
from tests.chat.families.conftest import official_template
from transformers import PreTrainedTokenizerBase

from toolrollout.chat import ChatFormat, check_drift
from toolrollout.chat.parsers import get_tool_parser
from toolrollout.integrations import trl_rollout_func
from toolrollout.interactions import Interaction
from toolrollout.rollout import RolloutConfig, RolloutRunner, Trajectory, TrajectoryStatus
from toolrollout.spec import RunSpec
from toolrollout.testing import ScriptedEngine, ScriptedOutput
from toolrollout.tools import Tool, function_tool

NEMO = "mistralai-Mistral-Nemo-Instruct-2407.jinja"
SMALL31 = "mistralai-Mistral-Small-3.1-24B-Instruct-2503.jinja"
SMALL32 = "Mistral-Small-3.2-24B-Instruct-2506.jinja"
TEMPLATES = NAMES = (NEMO, SMALL31, SMALL32)

MISTRAL_SPECIAL = [
    "<unk>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[TOOL_CALLS]",
    "[IMG]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[TOOL_CONTENT]",
    "[ARGS]",
    "[CALL_ID]",
]
NINE = re.compile(r"[A-Za-z0-9]{9}")


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def get_weather(city: str) -> str:
    """Current weather in a city."""
    return f"{city}: sunny\n21 C\nwind 3 km/h"


TOOLS: list[Tool] = [function_tool(add), function_tool(get_weather)]
SCHEMAS = [tool.schema() for tool in TOOLS]


def tokenizer_for(name: str) -> PreTrainedTokenizerBase:
    return build_tokenizer(
        special=MISTRAL_SPECIAL,
        added=[],
        template=official_template(name),
        eos="</s>",
        bos="<s>",
    )


@pytest.fixture(scope="module", params=TEMPLATES)
def mistral(request: pytest.FixtureRequest) -> tuple[str, PreTrainedTokenizerBase]:
    return request.param, tokenizer_for(request.param)


Call = tuple[str, dict[str, Any], str | None]
"""(name, arguments, the id the model writes or None)."""


def calls_text(template: str, calls: Sequence[Call]) -> str:
    """A model turn holding ``calls``, in the form ``template`` renders assistant calls."""
    if template == SMALL32:
        return (
            "".join(
                f"[TOOL_CALLS]{name}"
                + (f"[CALL_ID]{cid}" if cid else "")
                + f"[ARGS]{json.dumps(args)}"
                for name, args, cid in calls
            )
            + "</s>"
        )
    objects = ", ".join(
        json.dumps({"name": name, "arguments": args})[:-1] + (f', "id": "{cid}"}}' if cid else "}")
        for name, args, cid in calls
    )
    return ("[TOOL_CALLS][" if template == NEMO else "[TOOL_CALLS] [") + objects + "]</s>"


class FollowUp(Interaction):
    """Asks one more question after the model's first final answer."""

    async def generate_response(
        self, instance_id: str, messages: Sequence[Mapping[str, Any]], **kwargs: Any
    ) -> tuple[bool, str, float | None, dict[str, Any]]:
        asked = sum(1 for m in messages if m["role"] == "user")
        return asked >= 2, "And the weather in Rome?", None, {}


def run(
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    *,
    system: bool = True,
    follow_up: bool = False,
    config: RolloutConfig | None = None,
) -> Trajectory:
    def out(text: str) -> ScriptedOutput:
        ids = tokenizer.encode(text, add_special_tokens=False)
        return ScriptedOutput(ids, logprobs=[-0.5] * len(ids))

    runner = RolloutRunner(
        ScriptedEngine([out(t) for t in texts]),
        tokenizer,
        TOOLS,
        config=config,
        interactions={"follow": FollowUp()} if follow_up else None,
    )
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "What is 2 + 3? And the weather in Paris?"}
    ]
    if system:
        messages.insert(0, {"role": "system", "content": "You are a careful assistant."})
    row: dict[str, Any] = {"messages": messages}
    if follow_up:
        row["extra_info"] = {"interaction_kwargs": {"name": "follow"}}
    [trajectory] = anyio.run(runner.run, [row])
    return trajectory


def fresh_text(tokenizer: PreTrainedTokenizerBase, trajectory: Trajectory) -> str:
    text = tokenizer.apply_chat_template(
        [dict(m) for m in trajectory.messages],
        tools=[dict(schema) for schema in SCHEMAS],
        tokenize=False,
        add_generation_prompt=trajectory.messages[-1]["role"] != "assistant",
    )
    assert isinstance(text, str)
    return text


def decode(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int]) -> str:
    text = tokenizer.decode(list(ids))
    assert isinstance(text, str)
    return text


def token_id(tokenizer: PreTrainedTokenizerBase, token: str) -> int:
    found = tokenizer.convert_tokens_to_ids(token)
    assert isinstance(found, int)
    return found


def transcript(trajectory: Trajectory) -> list[int]:
    return list(trajectory.prompt_ids) + [i for span in trajectory.spans for i in span.ids]


def parallel(template: str, *, ids: bool) -> str:
    return calls_text(
        template,
        [
            ("add", {"a": 2, "b": 3}, "aB3dE5gH7" if ids else None),
            ("get_weather", {"city": "Paris"}, "Xy9Zw8Vu7" if ids else None),
        ],
    )


def test_official_templates_are_the_provenance_bytes() -> None:
    for name in NAMES:
        assert official_template(name)  # checks the sha256 recorded in PROVENANCE.md


def test_detected_without_a_family(mistral: tuple[str, PreTrainedTokenizerBase]) -> None:
    _, tokenizer = mistral
    family = ChatFormat(tokenizer).family
    assert family.name == "mistral" and family.tool_parser == "mistral"
    assert family.stop_tokens == ("</s>",) and family.boundary == ""


def test_parser_reads_what_the_official_template_writes(
    mistral: tuple[str, PreTrainedTokenizerBase],
) -> None:
    template, tokenizer = mistral
    message: dict[str, Any] = {
        "role": "assistant",
        "tool_calls": [
            {"id": "aB3dE5gH7", "type": "function",
             "function": {"name": "add", "arguments": {"a": 2, "b": 3}}},
            {"id": "Xy9Zw8Vu7", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
        ],
    }  # fmt: skip
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}, message],
        tools=[dict(schema) for schema in SCHEMAS],
        tokenize=False,
    )
    assert isinstance(text, str)
    turn = text.split("[/INST]", 1)[1]
    assert turn == parallel(template, ids=True)  # the scripted turns below use this form
    parsed = get_tool_parser("mistral").parse(turn)
    assert parsed.ok and parsed.content == ""
    assert [(c.id, c.name, c.arguments) for c in parsed.tool_calls] == [
        ("aB3dE5gH7", "add", {"a": 2, "b": 3}),
        ("Xy9Zw8Vu7", "get_weather", {"city": "Paris"}),
    ]


def test_parallel_calls_with_model_ids_are_token_exact(
    mistral: tuple[str, PreTrainedTokenizerBase],
) -> None:
    template, tokenizer = mistral
    trajectory = run(
        tokenizer, [parallel(template, ids=True), "5; Paris is sunny.</s>"], system=template != NEMO
    )
    assert trajectory.status is TrajectoryStatus.COMPLETED, trajectory.error
    assert trajectory.num_tool_calls == 2 and trajectory.parse_errors == 0
    assert trajectory.tool_errors == 0
    results = [
        (m["tool_call_id"], m["content"]) for m in trajectory.messages if m["role"] == "tool"
    ]
    assert results == [("aB3dE5gH7", "5"), ("Xy9Zw8Vu7", "Paris: sunny\n21 C\nwind 3 km/h")]
    assert trajectory.metrics["drift_mismatches"] == 0
    expected = tokenizer.encode(fresh_text(tokenizer, trajectory), add_special_tokens=False)
    assert transcript(trajectory) == list(expected)


def test_ids_alternation_and_tool_placement_over_turns(
    mistral: tuple[str, PreTrainedTokenizerBase],
) -> None:
    """Calls without ids get nine-character ones; a follow-up question keeps the roles
    alternating; the rewrites (tools block moves, Nemo's system message moves, ids the
    model did not write) are the documented ones, not mismatches."""
    template, tokenizer = mistral
    rome = calls_text(template, [("get_weather", {"city": "Rome"}, None)])
    trajectory = run(
        tokenizer,
        [parallel(template, ids=False), "5; sunny.</s>", rome, "Sunny too.</s>"],
        follow_up=True,
    )
    assert trajectory.status is TrajectoryStatus.COMPLETED, trajectory.error
    assert trajectory.num_tool_calls == 3 and trajectory.parse_errors == 0
    ids = [c["id"] for m in trajectory.messages for c in m.get("tool_calls", ())]
    assert len(set(ids)) == 3 and all(NINE.fullmatch(i) for i in ids)
    answered = [m["tool_call_id"] for m in trajectory.messages if m["role"] == "tool"]
    assert answered == ids
    assert [m["role"] for m in trajectory.messages] == [
        "system", "user", "assistant", "tool", "tool", "assistant",
        "user", "assistant", "tool", "assistant",
    ]  # fmt: skip
    assert trajectory.metrics["drift_mismatches"] == 0
    assert trajectory.metrics["drift_expected"] >= 1
    family = ChatFormat(tokenizer).family
    assert family.history_normalizer is not None
    text = decode(tokenizer, transcript(trajectory))
    fresh = fresh_text(tokenizer, trajectory)
    assert text != fresh
    assert family.history_normalizer(text) == family.history_normalizer(fresh)


@pytest.mark.parametrize(
    "bad",
    [
        '[TOOL_CALLS][{"name": "add", "arguments": {"a": 2,}}]</s>',
        '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 2, "b": 3}, "id": "call_1"}]</s>',
        '[TOOL_CALLS]add[ARGS]{"a": 2, "b": 3}[TOOL_CALLS]get_weather[ARGS]{"city": }</s>',
        "[TOOL_CALLS]add[CALL_ID]short[ARGS]{}</s>",
    ],
)
def test_malformed_call_is_counted_and_answered_by_a_user_turn(
    mistral: tuple[str, PreTrainedTokenizerBase], bad: str
) -> None:
    template, tokenizer = mistral
    add_call = calls_text(template, [("add", {"a": 2, "b": 3}, "aB3dE5gH7")])
    trajectory = run(tokenizer, [bad, add_call, "5.</s>"])
    assert trajectory.status is TrajectoryStatus.COMPLETED, trajectory.error
    assert trajectory.parse_errors == 1 and trajectory.num_tool_calls == 1
    wrong, told = trajectory.messages[2], trajectory.messages[3]
    assert "tool_calls" not in wrong and wrong["content"] == bad.removesuffix("</s>")
    assert told["role"] == "user" and "could not parse tool call" in told["content"]
    assert trajectory.metrics["drift_mismatches"] == 0
    fresh_text(tokenizer, trajectory)  # the messages still render (roles alternate)


def test_the_checks_fail_when_the_rules_break(
    mistral: tuple[str, PreTrainedTokenizerBase],
) -> None:
    template, tokenizer = mistral
    # Parser off: the calls are plain text, nothing runs.
    plain = run(
        tokenizer,
        [parallel(template, ids=True), "5.</s>"],
        config=RolloutConfig(tool_parser="hermes"),
    )
    assert plain.num_tool_calls == 0
    # A boundary the template does not write is drift the check reports.
    trajectory = run(tokenizer, [parallel(template, ids=True), "5.</s>"], system=template != NEMO)
    chat = ChatFormat(tokenizer, tools=SCHEMAS)
    ids = transcript(trajectory)
    eos = token_id(tokenizer, "</s>")
    at = ids.index(eos, len(trajectory.prompt_ids)) + 1
    broken = ids[:at] + tokenizer.encode("\n", add_special_tokens=False) + ids[at:]
    messages = [dict(m) for m in trajectory.messages]
    assert check_drift(broken, messages, chat_format=chat).kind == "text"
    assert check_drift(ids, messages, chat_format=chat).matches


def test_parser_keeps_model_ids_and_refuses_ids_the_templates_refuse() -> None:
    parser = get_tool_parser("mistral", id_factory=lambda index: f"call_{index}")
    kept = parser.parse(
        '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1}, "id": "aB3dE5gH7"}, '
        '{"name": "add", "arguments": {"a": 2}}]</s>'
    )
    assert kept.ok and [c.id for c in kept.tool_calls] == ["aB3dE5gH7", "call_1"]
    for text in (
        '[TOOL_CALLS][{"name": "add", "arguments": {}, "id": "abc"}]',
        '[TOOL_CALLS][{"name": "add", "arguments": {}, "id": 123456789}]',
        '[TOOL_CALLS][{"name": "add", "arguments": {}, "id": "abc_12345"}]',
        "[TOOL_CALLS]add[CALL_ID]abcdefghij[ARGS]{}",
    ):
        turn = parser.parse(text)
        assert turn.tool_calls == () and len(turn.errors) == 1, text
        assert "9 letters or digits" in turn.errors[0].message


def test_text_before_the_calls_is_a_documented_rewrite(
    mistral: tuple[str, PreTrainedTokenizerBase],
) -> None:
    """The templates render only the calls of a turn that has calls."""
    template, tokenizer = mistral
    trajectory = run(tokenizer, ["Let me check. " + parallel(template, ids=True), "5.</s>"])
    assert trajectory.num_tool_calls == 2 and trajectory.parse_errors == 0
    assert trajectory.messages[2]["content"] == "Let me check."
    assert trajectory.metrics["drift_mismatches"] == 0
    assert trajectory.metrics["drift_expected"] == 1


def test_trl_adapter_with_the_family_named(mistral: tuple[str, PreTrainedTokenizerBase]) -> None:
    template, tokenizer = mistral
    texts = [parallel(template, ids=True), "5; sunny.</s>"]
    engine = ScriptedEngine([list(tokenizer.encode(t, add_special_tokens=False)) for t in texts])
    prompt = [{"role": "user", "content": "What is 2 + 3? And the weather in Paris?"}]
    with trl_rollout_func(
        engine, tokenizer, RunSpec(tools=TOOLS, config=RolloutConfig(family="mistral"))
    ) as rollout:
        out = rollout([prompt])
        [trajectory] = rollout.last_trajectories
    assert rollout.runner.chat.family.name == "mistral"
    assert out["num_tool_calls"] == [2] and trajectory.parse_errors == 0
    masked = [t for t, m in zip(out["completion_ids"][0], out["env_mask"][0], strict=True) if not m]
    assert decode(tokenizer, masked).startswith("[TOOL_RESULTS]")
    assert trajectory.metrics["drift_mismatches"] == 0
