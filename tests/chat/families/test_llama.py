"""Llama 3.1 / 3.2 with their official chat templates, end to end through the runner.

The templates are Meta's, vendored byte-identical (tests/chat/templates/official); the
tokenizer is trained here with Llama 3's special tokens. The model is scripted, so each
turn's text is exactly what a Llama model writes: a bare ``{"name": ..., "parameters":
{...}}`` call ended by ``<|eot_id|>``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import pytest
from jinja2 import TemplateError
from tests.chat.conftest import LLAMA_SPECIAL, build_tokenizer
from tests.chat.families.conftest import official_template
from transformers import PreTrainedTokenizerBase

from toolrollout.chat import ChatFormat, check_drift
from toolrollout.integrations import trl_rollout_func
from toolrollout.interactions import Interaction
from toolrollout.rollout import RolloutConfig, RolloutRunner, Trajectory, TrajectoryStatus
from toolrollout.spec import RunSpec
from toolrollout.testing import ScriptedEngine, ScriptedOutput
from toolrollout.tools import Tool, function_tool

LLAMA31 = "meta-llama-Llama-3.1-8B-Instruct.jinja"
LLAMA32 = "meta-llama-Llama-3.2-3B-Instruct.jinja"
NAMES = (LLAMA31, LLAMA32)
DATE = {"date_string": "26 Jul 2024"}


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def get_weather(city: str) -> str:
    """Current weather in a city."""
    return f"{city}: sunny\n21 C\nwind 3 km/h"


TOOLS: list[Tool] = [function_tool(add), function_tool(get_weather)]


def tokenizer_for(name: str) -> PreTrainedTokenizerBase:
    return build_tokenizer(
        special=LLAMA_SPECIAL,
        added=[],
        template=official_template(name),
        eos="<|eot_id|>",
        bos="<|begin_of_text|>",
    )


@pytest.fixture(scope="module", params=[LLAMA31, LLAMA32])
def llama(request: pytest.FixtureRequest) -> PreTrainedTokenizerBase:
    return tokenizer_for(request.param)


@pytest.fixture(scope="module")
def llama32() -> PreTrainedTokenizerBase:
    return tokenizer_for(LLAMA32)


class FollowUp(Interaction):
    """Answers the model's first final turn with one more question, then ends."""

    async def generate_response(
        self, instance_id: str, messages: Sequence[Mapping[str, Any]], **kwargs: Any
    ) -> tuple[bool, str, float | None, dict[str, Any]]:
        asked = sum(1 for m in messages if m["role"] == "user")
        return asked >= 2, "And the weather in Rome?", None, {}


def run(
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    *,
    config: RolloutConfig | None = None,
    follow_up: bool = False,
) -> tuple[RolloutRunner, Trajectory]:
    def out(text: str) -> ScriptedOutput:
        ids = tokenizer.encode(text, add_special_tokens=False)
        return ScriptedOutput(ids, logprobs=[-0.5] * len(ids))

    runner = RolloutRunner(
        ScriptedEngine([out(t) for t in texts]),
        tokenizer,
        TOOLS,
        config=config or RolloutConfig(chat_template_kwargs=DATE),
        interactions={"follow": FollowUp()} if follow_up else None,
    )
    row: dict[str, Any] = {
        "messages": [
            {"role": "system", "content": "You are a careful assistant."},
            {"role": "user", "content": "What is 2 + 3? And the weather in Paris?"},
        ]
    }
    if follow_up:
        row["extra_info"] = {"interaction_kwargs": {"name": "follow"}}
    [trajectory] = anyio.run(runner.run, [row])
    return runner, trajectory


def fresh_ids(
    tokenizer: PreTrainedTokenizerBase, trajectory: Trajectory, kwargs: Mapping[str, Any]
) -> list[int]:
    """The official template's render of the trajectory's messages, tokenized."""
    text = tokenizer.apply_chat_template(
        [dict(m) for m in trajectory.messages],
        tools=[tool.schema() for tool in TOOLS],
        tokenize=False,
        add_generation_prompt=trajectory.messages[-1]["role"] != "assistant",
        **kwargs,
    )
    assert isinstance(text, str)
    return list(tokenizer.encode(text, add_special_tokens=False))


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


CALL_ADD = '{"name": "add", "parameters": {"a": 2, "b": 3}}<|eot_id|>'
CALL_WEATHER = '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>'
CALL_ROME = '{"name": "get_weather", "parameters": {"city": "Rome"}}<|eot_id|>'


def test_official_templates_are_the_provenance_bytes() -> None:
    for name in NAMES:
        assert official_template(name)  # checks the sha256 recorded in PROVENANCE.md


def test_detected_without_a_family(llama: PreTrainedTokenizerBase) -> None:
    chat = ChatFormat(llama)
    assert chat.family.name == "llama3"
    assert chat.family.max_calls_per_turn == 1 and not chat.family.parallel_calls


def test_multi_turn_run_is_token_exact(llama: PreTrainedTokenizerBase) -> None:
    _, trajectory = run(
        llama,
        [
            CALL_ADD,
            CALL_WEATHER,
            "2 + 3 = 5; Paris is sunny.<|eot_id|>",
            CALL_ROME,
            "Sunny.<|eot_id|>",
        ],
        follow_up=True,
    )
    assert trajectory.status is TrajectoryStatus.COMPLETED, trajectory.error
    assert trajectory.num_tool_calls == 3 and trajectory.parse_errors == 0
    assert trajectory.tool_errors == 0
    assert [s.kind for s in trajectory.spans] == [
        "model", "tool", "model", "tool", "model", "interaction", "model", "tool", "model",
    ]  # fmt: skip
    results = [m["content"] for m in trajectory.messages if m["role"] == "tool"]
    assert results == ["5", "Paris: sunny\n21 C\nwind 3 km/h", "Rome: sunny\n21 C\nwind 3 km/h"]
    calls = [m["tool_calls"] for m in trajectory.messages if "tool_calls" in m]
    assert calls[0][0]["function"] == {"name": "add", "arguments": {"a": 2, "b": 3}}
    assert trajectory.metrics["drift_mismatches"] == 0
    assert transcript(trajectory) == fresh_ids(llama, trajectory, DATE)
    # The multi-line result is a JSON string in its ipython turn, as the template writes it.
    assert '"Paris: sunny\\n21 C\\nwind 3 km/h"<|eot_id|>' in decode(llama, transcript(trajectory))


def test_llama32_date_follows_the_kwarg_or_today(llama32: PreTrainedTokenizerBase) -> None:
    _, dated = run(llama32, [CALL_ADD, "5.<|eot_id|>"])
    assert "Today Date: 26 Jul 2024\n" in decode(llama32, dated.prompt_ids)
    _, today = run(llama32, [CALL_ADD, "5.<|eot_id|>"], config=RolloutConfig())
    text = decode(llama32, today.prompt_ids)
    assert re.search(r"Today Date: \d\d [A-Z][a-z]{2} \d{4}\n", text)
    assert "26 Jul 2024" not in text
    assert today.metrics["drift_mismatches"] == 0 and today.num_tool_calls == 1
    assert transcript(today) == fresh_ids(llama32, today, {})


def test_two_calls_in_a_turn_are_one_counted_error(llama: PreTrainedTokenizerBase) -> None:
    two = '{"name": "add", "parameters": {"a": 2, "b": 3}}; ' + CALL_WEATHER
    # The official template refuses to render such a turn ...
    call = {"type": "function", "function": {"name": "add", "arguments": {}}}
    refused: list[dict[str, Any]] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "tool_calls": [call, call]},
    ]
    with pytest.raises(TemplateError, match="only supports single tool-calls at once"):
        llama.apply_chat_template(refused, tokenize=False)
    # ... so the rollout runs neither call, tells the model, and keeps the turn's text.
    _, trajectory = run(llama, [two, CALL_ADD, "5.<|eot_id|>"])
    assert trajectory.status is TrajectoryStatus.COMPLETED, trajectory.error
    assert trajectory.parse_errors == 1 and trajectory.num_tool_calls == 1
    first = trajectory.messages[2]
    assert first["role"] == "assistant" and "tool_calls" not in first
    assert first["content"] == two.removesuffix("<|eot_id|>")
    told = trajectory.messages[3]
    assert told["role"] == "tool" and "at most 1 tool call" in told["content"]
    assert trajectory.metrics["drift_mismatches"] == 0
    assert transcript(trajectory) == fresh_ids(llama, trajectory, DATE)


def test_default_config_runs_a_llama_call(llama: PreTrainedTokenizerBase) -> None:
    runner, trajectory = run(llama, [CALL_ADD, "5.<|eot_id|>"], config=RolloutConfig())
    assert runner.config.tool_parser is None and runner.config.family is None
    assert runner.parser.name == "llama3"
    assert trajectory.num_tool_calls == 1 and trajectory.parse_errors == 0
    assert trajectory.messages[3] == {"role": "tool", "content": "5", **_ids(trajectory)}


def _ids(trajectory: Trajectory) -> dict[str, str]:
    call = trajectory.messages[2]["tool_calls"][0]
    return {"tool_call_id": call["id"], "name": "add"}


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "add", "parameters": {"a": 2, "b": }}<|eot_id|>',
        '<|python_tag|>{"name": "add", "parameters": [2, 3]}<|eom_id|>',
        "<|python_tag|><|eom_id|>",
    ],
)
def test_malformed_call_is_a_counted_parse_error(llama: PreTrainedTokenizerBase, text: str) -> None:
    _, trajectory = run(llama, [text, "Sorry.<|eot_id|>"])
    assert trajectory.status is TrajectoryStatus.COMPLETED, trajectory.error
    assert trajectory.parse_errors == 1 and trajectory.num_tool_calls == 0
    assert trajectory.messages[3]["content"].startswith("Error: could not parse tool call")
    assert trajectory.metrics["drift_mismatches"] == 0


def test_the_checks_fail_when_the_rules_break(llama: PreTrainedTokenizerBase) -> None:
    # Parser off: the call is plain text, nothing runs.
    _, plain = run(llama, [CALL_ADD, "5.<|eot_id|>"], config=RolloutConfig(tool_parser="qwen25"))
    assert plain.num_tool_calls == 0
    # A wrong boundary after the stop token is drift the check reports.
    _, trajectory = run(llama, [CALL_ADD, "5.<|eot_id|>"])
    chat = ChatFormat(llama, tools=[tool.schema() for tool in TOOLS], template_kwargs=DATE)
    ids = transcript(trajectory)
    eot = token_id(llama, "<|eot_id|>")
    at = ids.index(eot, len(trajectory.prompt_ids)) + 1
    broken = ids[:at] + llama.encode("\n", add_special_tokens=False) + ids[at:]
    report = check_drift(broken, [dict(m) for m in trajectory.messages], chat_format=chat)
    assert report.kind == "text"
    assert check_drift(ids, [dict(m) for m in trajectory.messages], chat_format=chat).matches


def test_python_tag_call_ended_by_eom_is_run(llama: PreTrainedTokenizerBase) -> None:
    """Llama may open a call with ``<|python_tag|>`` and end it with ``<|eom_id|>``; the
    template re-renders that end as ``<|eot_id|>``, a documented rewrite, not a mismatch."""
    tagged = '<|python_tag|>{"name": "add", "parameters": {"a": 2, "b": 3}}<|eom_id|>'
    _, trajectory = run(llama, [tagged, "5.<|eot_id|>"])
    assert trajectory.status is TrajectoryStatus.COMPLETED, trajectory.error
    assert trajectory.num_tool_calls == 1 and trajectory.parse_errors == 0
    assert trajectory.metrics["drift_mismatches"] == 0
    assert trajectory.metrics["drift_expected"] == 1


def test_trl_adapter_detects_the_family(llama: PreTrainedTokenizerBase) -> None:
    engine = ScriptedEngine(
        [list(llama.encode(t, add_special_tokens=False)) for t in (CALL_ADD, "5.<|eot_id|>")]
    )
    prompt = [{"role": "user", "content": "What is 2 + 3?"}]
    with trl_rollout_func(
        engine, llama, RunSpec(tools=TOOLS, config=RolloutConfig(chat_template_kwargs=DATE))
    ) as rollout:
        out = rollout([prompt])
        [trajectory] = rollout.last_trajectories
    assert rollout.runner.chat.family.name == "llama3"
    assert out["num_tool_calls"] == [1] and trajectory.parse_errors == 0
    masked = [t for t, m in zip(out["completion_ids"][0], out["env_mask"][0], strict=True) if not m]
    expected = (
        '<|start_header_id|>ipython<|end_header_id|>\n\n"5"<|eot_id|>'
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert decode(llama, masked) == expected
    assert trajectory.metrics["drift_mismatches"] == 0
