"""The family hooks every model family builds on, each checked on a small template.

The per-family tests (``tests/chat/families``) run the official templates; these pin the
generic rules: detection errors name the option to set, a turn with more calls than the
template renders is one counted parse error, templates that ignore ``tools`` get them in
the system message, a stop token that opens the next turn starts the delta after it, call
ids follow the family's rule, and documented drift is not counted as a mismatch.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from tests.chat.conftest import QWEN_ADDED, build_tokenizer
from tests.chat.families.conftest import fresh_render_ids
from transformers import PreTrainedTokenizerBase

from toolrollout.chat import ChatFormat, TemplateFamily
from toolrollout.chat.families import CallIdRequest, get_template_family
from toolrollout.exceptions import FieldError, UserError
from toolrollout.rollout import RolloutConfig, RolloutRunner, TrajectoryStatus
from toolrollout.rollout._drift import DriftLedger
from toolrollout.tools import function_tool


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


ADD = function_tool(add)
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'

# A GLM-like format of our own: no end-of-turn token; the model stops at the token that
# opens the next turn (<|observation|> before tool results, <|user|> at the end).
_OPENER_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'user' -%}<|user|>\n{{ m.content }}"
    "{%- elif m.role == 'assistant' -%}<|assistant|>\n{{ m.content }}"
    "{%- for c in m.tool_calls or [] -%}"
    '<tool_call>\n{"name": "{{ c.function.name }}", '
    '"arguments": {{ c.function.arguments | tojson }}}'
    "\n</tool_call>"
    "{%- endfor -%}"
    "{%- elif m.role == 'tool' -%}<|observation|>\n{{ m.content }}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>\n{% endif -%}"
)
OPENER_FAMILY = TemplateFamily(
    name="opener_test",
    stop_tokens=("<|observation|>", "<|user|>"),
    boundary="",
    generation_prompt="<|assistant|>\n",
    tool_parser="hermes",
    stop_opens_next_turn=True,
)


@pytest.fixture(scope="module")
def opener_tokenizer() -> PreTrainedTokenizerBase:
    return build_tokenizer(
        special=["<|endoftext|>", "<|user|>", "<|assistant|>", "<|observation|>"],
        added=QWEN_ADDED,
        template=_OPENER_TEMPLATE,
        eos="<|user|>",
    )


def _with_family(runner: RolloutRunner, tokenizer: Any, family: TemplateFamily) -> None:
    runner.chat = ChatFormat(tokenizer, tools=runner.tools.schemas(), family=family)


def test_an_undetectable_template_names_the_option(
    qwen25_tokenizer: PreTrainedTokenizerBase,
) -> None:
    with pytest.raises(FieldError, match=r"set config\.family \(family= in the trainer") as e:
        ChatFormat(qwen25_tokenizer, chat_template="{{ messages[0]['content'] }}")
    assert e.value.render({"config.family": "--family"}).count("--family") == 1
    with pytest.raises(UserError, match="unknown model family 'nope'; known: "):
        RolloutConfig(family="nope")
    with pytest.raises(UserError, match="chat_template_kwargs"):
        RolloutConfig(chat_template_kwargs=[("enable_thinking", False)])  # type: ignore[arg-type]


def test_family_and_template_kwargs_reach_the_format(
    qwen3_tokenizer: PreTrainedTokenizerBase,
) -> None:
    config = RolloutConfig(family="qwen25", chat_template_kwargs={"enable_thinking": False})
    runner = RolloutRunner(object(), qwen3_tokenizer, [ADD], config=config)  # type: ignore[arg-type]
    assert runner.chat.family.name == "qwen25"  # named, not detected (qwen3 otherwise)
    assert runner.chat.template_kwargs == {"enable_thinking": False}
    assert runner.parser is not None


def test_more_calls_than_the_template_renders_is_one_parse_error(
    qwen25_tokenizer: PreTrainedTokenizerBase,
) -> None:
    family = dataclasses.replace(get_template_family("qwen25"), max_calls_per_turn=1)
    turns = [f"{CALL}\n{CALL}<|im_end|>", f"{CALL}<|im_end|>", "5<|im_end|>"]
    prompt = [{"role": "user", "content": "2+3?"}]
    runner = RolloutRunner(object(), qwen25_tokenizer, [ADD])  # type: ignore[arg-type]
    _with_family(runner, qwen25_tokenizer, family)
    from toolrollout.testing import ScriptedEngine, ScriptedOutput

    runner.engine = ScriptedEngine(
        [ScriptedOutput(ids, [-0.5] * len(ids)) for ids in map(runner.chat.encode, turns)]
    )
    import anyio

    [trajectory] = anyio.run(runner.run, [prompt])
    assert trajectory.status is TrajectoryStatus.COMPLETED, trajectory.error
    assert trajectory.parse_errors == 1
    assert trajectory.num_tool_calls == 1  # only the single call of the second turn ran
    first_answer = trajectory.messages[2]
    assert "tool_calls" not in trajectory.messages[1]
    assert "at most 1 tool call per turn; 2 were written" in first_answer["content"]
    assert trajectory.metrics["drift_mismatches"] == 0
    assert list(trajectory.prompt_ids) + list(trajectory.response_ids) == fresh_render_ids(
        qwen25_tokenizer, runner, trajectory
    )


def test_tools_fallback_puts_schemas_in_the_system_message(
    qwen25_tokenizer: PreTrainedTokenizerBase,
) -> None:
    family = dataclasses.replace(
        get_template_family("qwen25"),
        tools_fallback=lambda tools: "TOOLS: " + ", ".join(t["function"]["name"] for t in tools),
    )
    from toolrollout.tools import ToolExecutor

    chat = ChatFormat(qwen25_tokenizer, tools=ToolExecutor([ADD]).schemas(), family=family)
    text = chat.render_text([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert "<|im_start|>system\nTOOLS: add<|im_end|>" in text
    with_system = chat.render_text(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        add_generation_prompt=True,
    )
    assert "Be brief.\n\nTOOLS: add" in with_system


def test_a_stop_token_that_opens_the_next_turn(opener_tokenizer: PreTrainedTokenizerBase) -> None:
    prompt = [{"role": "user", "content": "2+3?"}]
    runner, trajectory, _ = _opener_run(opener_tokenizer, prompt)
    assert trajectory.status is TrajectoryStatus.COMPLETED, trajectory.error
    assert trajectory.num_tool_calls == 1 and trajectory.parse_errors == 0
    [tool_span] = [span for span in trajectory.spans if span.kind == "tool"]
    # The delta starts after the <|observation|> the model sampled: it is not repeated.
    assert runner.chat.decode(tool_span.ids) == "\n5<|assistant|>\n"
    text = runner.chat.render_text(list(trajectory.messages), add_generation_prompt=False)
    expected = runner.chat.encode(text + "<|user|>")
    assert list(trajectory.prompt_ids) + list(trajectory.response_ids) == expected
    assert trajectory.metrics["drift_mismatches"] == 0


def _opener_run(tokenizer: Any, prompt: list[dict[str, Any]]) -> Any:
    import anyio

    from toolrollout.testing import ScriptedEngine, ScriptedOutput

    config = RolloutConfig(family=OPENER_FAMILY)
    runner = RolloutRunner(object(), tokenizer, [ADD], config=config)  # type: ignore[arg-type]
    turns = [f"{CALL}<|observation|>", "It is 5.<|user|>"]
    runner.engine = ScriptedEngine(
        [ScriptedOutput(ids, [-0.5] * len(ids)) for ids in map(runner.chat.encode, turns)]
    )
    [trajectory] = anyio.run(runner.run, [prompt])
    return runner, trajectory, None


def test_call_ids_follow_the_family_rule(qwen25_tokenizer: PreTrainedTokenizerBase) -> None:
    seen: list[CallIdRequest] = []

    def nine(request: CallIdRequest) -> str:
        seen.append(request)
        return f"id{request.call_number:07d}"

    family = dataclasses.replace(get_template_family("qwen25"), call_id=nine)
    import anyio

    from toolrollout.testing import ScriptedEngine, ScriptedOutput

    runner = RolloutRunner(object(), qwen25_tokenizer, [ADD])  # type: ignore[arg-type]
    _with_family(runner, qwen25_tokenizer, family)
    turns = [f"{CALL}\n{CALL}<|im_end|>", f"{CALL}<|im_end|>", "5<|im_end|>"]
    runner.engine = ScriptedEngine(
        [ScriptedOutput(ids, [-0.5] * len(ids)) for ids in map(runner.chat.encode, turns)]
    )
    [trajectory] = anyio.run(runner.run, [[{"role": "user", "content": "2+3?"}]])
    call_ids = [c["id"] for m in trajectory.messages for c in m.get("tool_calls", [])]
    answered = [m["tool_call_id"] for m in trajectory.messages if m["role"] == "tool"]
    assert call_ids == answered == ["id0000000", "id0000001", "id0000002"]
    assert [r.index for r in seen] == [0, 1, 0] and not any(r.model_wrote_id for r in seen)


def test_documented_drift_is_not_a_mismatch() -> None:
    ledger = DriftLedger()
    ledger.found = {0: {"kind": "history_rewrite"}, 1: {"kind": "history_rewrite"}}
    assert (ledger.mismatches(), ledger.expected()) == (0, 2)
    ledger.found[2] = {"kind": "text"}
    ledger.found[3] = {"kind": "render_error"}
    ledger.found[4] = {"kind": "retokenization"}  # other ids than a re-render would train
    assert (ledger.mismatches(), ledger.expected()) == (3, 2)


def test_a_leftover_resumes_only_with_the_same_family(
    qwen3_tokenizer: PreTrainedTokenizerBase,
) -> None:
    from toolrollout.rollout._compat import chat_setup, check_leftover_matches, leftover_info

    thinking_off = RolloutConfig(chat_template_kwargs={"enable_thinking": False})
    saved = leftover_info(
        n=1,
        tool_names=["add"],
        tool_parser="qwen3",
        tokenizer=qwen3_tokenizer,
        model="m",
        chat=chat_setup(thinking_off, qwen3_tokenizer),
    )
    assert saved["chat"] == {"family": "qwen3", "chat_template_kwargs": {"enable_thinking": False}}
    same = chat_setup(thinking_off, qwen3_tokenizer)
    check_leftover_matches("left.pkl", saved, tool_names=["add"], tool_parser="qwen3", chat=same)
    other = chat_setup(RolloutConfig(family="qwen25"), qwen3_tokenizer)
    with pytest.raises(UserError, match=r"same config\.family / config\.chat_template_kwargs"):
        check_leftover_matches(
            "left.pkl", saved, tool_names=["add"], tool_parser="qwen3", chat=other
        )
