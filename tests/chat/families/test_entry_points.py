"""Every family through every way a run is configured: the runner, the CLI, the TRL adapter.

Each family's own test checks its format in depth. This one checks that nothing between
the user and the family drops it: with only the tokenizer (its template) and, where given,
``--family`` / ``family=``, the calculator call the model writes is parsed and executed,
the transcript is token-exact, and the output rows say so.

The model's turns are what the family's template itself renders for the assistant message
(so no format is written here by hand), tokenized with a tokenizer trained in the test on
the template's own control tokens.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import pytest
from tests.chat.conftest import TEMPLATES, build_tokenizer
from tests.chat.families._scripted_server import scripted_sglang_server
from tests.chat.families.conftest import OFFICIAL
from tests.chat.families.test_deepseek import BOS as DSK_BOS
from tests.chat.families.test_deepseek import EOS as DSK_EOS
from tests.chat.families.test_deepseek import B as DSK_B
from tests.chat.families.test_deepseek import E as DSK_E
from tests.chat.families.test_deepseek import v3_call
from typer.testing import CliRunner

from toolrollout.chat import ChatFormat
from toolrollout.chat.families import get_template_family
from toolrollout.integrations import trl_rollout_func
from toolrollout.rollout import RolloutConfig, RolloutRunner, Trajectory, TrajectoryStatus
from toolrollout.spec import RunSpec
from toolrollout.testing import ScriptedEngine, ScriptedOutput
from toolrollout.tools import ToolExecutor, calculator_tool


@dataclass(frozen=True)
class Case:
    """One family with one template (official where vendored)."""

    family: str
    template: Path
    bos: str | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    detected: bool = True
    """Whether the template is recognised without ``--family``."""
    system: bool = True
    """Whether the prompt has a system message (Nemo moves it into the last user turn,
    a documented rewrite its own test covers; here the prompt has none)."""

    turns: tuple[str, ...] = ()
    """The model's turns as text, where the template's own render cannot give them
    (DeepSeek-V3's generation prompt opens a think block that its re-render drops)."""
    call_id: str = "aBc123XyZ"
    """The id of the scripted call (Kimi-K2 reads the tool name out of its ids)."""

    @property
    def prompt(self) -> list[dict[str, Any]]:
        return PROMPT if self.system else PROMPT[1:]

    @property
    def id(self) -> str:
        kwargs = "-".join(f"{k}={v}" for k, v in self.template_kwargs.items())
        return f"{self.family}-{self.template.stem}" + (f"-{kwargs}" if kwargs else "")


CASES = [
    Case("qwen25", TEMPLATES / "qwen25.jinja"),
    Case("qwen3", TEMPLATES / "qwen3.jinja"),
    Case("qwen3", TEMPLATES / "qwen3.jinja", template_kwargs={"enable_thinking": False}),
    Case("llama3", TEMPLATES / "llama3.jinja", bos="<|begin_of_text|>"),
    Case("gpt_oss", OFFICIAL / "openai-gpt-oss-120b.jinja"),
    Case("llama3", OFFICIAL / "meta-llama-Llama-3.1-8B-Instruct.jinja", bos="<|begin_of_text|>"),
    Case(
        "llama3",
        OFFICIAL / "meta-llama-Llama-3.2-3B-Instruct.jinja",
        bos="<|begin_of_text|>",
        template_kwargs={"date_string": "26 Jul 2024"},
    ),
    Case("mistral", OFFICIAL / "mistralai-Mistral-Nemo-Instruct-2407.jinja", "<s>", system=False),
    Case("mistral", OFFICIAL / "Mistral-Small-3.2-24B-Instruct-2506.jinja", bos="<s>"),
    Case("qwen25", OFFICIAL / "Qwen-Qwen2.5-7B-Instruct.jinja"),
    Case("qwen3", OFFICIAL / "Qwen-Qwen3-0.6B.jinja"),
    Case("qwen3", OFFICIAL / "trl-qwen3.jinja", template_kwargs={"enable_thinking": False}),
    Case("qwen3_coder", OFFICIAL / "Qwen3-Coder.jinja"),
    Case("qwen3_vl", OFFICIAL / "trl-qwen3_vl.jinja"),
    Case("qwen35", OFFICIAL / "trl-qwen3_5_think.jinja"),
    Case("qwen35", OFFICIAL / "trl-qwen3_6.jinja", template_kwargs={"enable_thinking": False}),
    Case(
        "deepseekv3",
        OFFICIAL / "trl-deepseekv3.jinja",
        bos=DSK_BOS,
        turns=(
            f"Use the calculator.</think>\n\n{DSK_B}"
            f"{v3_call('calculator', {'expression': '2 + 3'})}{DSK_E}{DSK_EOS}",
            f"The answer is 5.{DSK_EOS}",
        ),
    ),
    Case(
        "deepseekv31",
        OFFICIAL / "deepseek-ai-DeepSeek-V3.1.jinja",
        bos="<｜begin▁of▁sentence｜>",
    ),
    Case(
        "kimi_k2",
        OFFICIAL / "moonshotai-Kimi-K2-Thinking.jinja",
        call_id="functions.calculator:0",
    ),
    Case("glm45", OFFICIAL / "trl-glm4moe.jinja"),
    Case("glm45", OFFICIAL / "GLM-4.6.jinja"),
]

PROMPT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is 2 + 3?"},
]
CALL = {
    "id": "aBc123XyZ",
    "type": "function",
    "function": {"name": "calculator", "arguments": {"expression": "2 + 3"}},
}

_SPECIAL = (r"<\|[^|<>\s]+\|>", r"<｜[^｜]+｜>", r"\[/?[A-Z_]{3,}\]")
_ADDED = r"</?[a-z_]+>"


def _tokenizer(case: Case) -> Any:
    text = case.template.read_text(encoding="utf-8")
    family = get_template_family(case.family)
    special = {m for pattern in _SPECIAL for m in re.findall(pattern, text)}
    special |= set(family.stop_tokens) | ({case.bos} if case.bos else set())
    added = set(re.findall(_ADDED, text)) - special
    return build_tokenizer(
        special=sorted(special),
        added=sorted(added),
        template=text,
        eos=family.stop_tokens[0],
        bos=case.bos,
    )


def _format(tokenizer: Any, case: Case) -> ChatFormat:
    """The format a run with the calculator renders (tool schemas in the prompt)."""
    tools = ToolExecutor([calculator_tool()]).schemas()
    return ChatFormat(
        tokenizer, tools=tools, family=case.family, template_kwargs=case.template_kwargs
    )


def _model_texts(chat: ChatFormat, case: Case) -> list[str]:
    """The two turns, as the template writes them: a calculator call, then the answer."""
    if case.turns:
        return list(case.turns)
    family = chat.family
    arguments: Any = {"expression": "2 + 3"}
    if family.arguments_as == "json":  # DeepSeek templates print the JSON string as given
        arguments = json.dumps(arguments)
    tool_call = {
        **CALL,
        "id": case.call_id,
        "function": {"name": "calculator", "arguments": arguments},
    }
    call: dict[str, Any] = {"role": "assistant", "content": "", "tool_calls": [tool_call]}
    result: dict[str, Any] = {"role": "tool", "tool_call_id": case.call_id, "content": "5"}
    result["name"] = "calculator"
    answer: dict[str, Any] = {"role": "assistant", "content": "The answer is 5."}
    texts = []
    steps: list[tuple[list[dict[str, Any]], dict[str, Any]]] = [
        ([*case.prompt], call),
        ([*case.prompt, call, result], answer),
    ]
    for before, turn in steps:
        prefix = chat.render_text(before, add_generation_prompt=True)
        full = chat.render_text([*before, turn], add_generation_prompt=False)
        assert full.startswith(prefix), "the template does not extend its own generation prompt"
        text = full[len(prefix) :]
        if family.stop_opens_next_turn:
            text += family.stop_tokens[0] if turn is call else family.stop_tokens[-1]
        elif family.boundary and text.endswith(family.boundary):
            text = text[: -len(family.boundary)]
        texts.append(text)
    return texts


def _config(case: Case, *, named: bool) -> RolloutConfig:
    return RolloutConfig(
        family=case.family if named or not case.detected else None,
        chat_template_kwargs=case.template_kwargs,
        max_turns=4,
    )


def _check_trajectory(trajectory: Trajectory, chat: ChatFormat) -> None:
    assert trajectory.status is TrajectoryStatus.COMPLETED, trajectory.error
    assert trajectory.num_tool_calls == 1 and trajectory.parse_errors == 0
    assert trajectory.tool_errors == 0
    tool_messages = [m for m in trajectory.messages if m["role"] in ("tool", "ipython")]
    assert [m["content"] for m in tool_messages] == ["5"]  # the real calculator ran
    assert trajectory.metrics["drift_mismatches"] == 0
    messages = list(trajectory.messages)
    text = chat.render_text(messages, add_generation_prompt=False)
    if chat.family.boundary and text.endswith(chat.family.boundary):
        text = text[: -len(chat.family.boundary)]
    transcript = chat.decode([*trajectory.prompt_ids, *trajectory.response_ids])
    normal = chat.family.history_normalizer or (lambda t: t)
    if chat.family.stop_opens_next_turn:
        text += chat.decode(trajectory.response_ids[-1:])
    assert normal(transcript) == normal(text)  # Trajectory.messages re-render the transcript


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_runner_detects_the_family_and_runs_its_calls(case: Case) -> None:
    tokenizer = _tokenizer(case)
    chat = _format(tokenizer, case)
    turns = [chat.encode(text) for text in _model_texts(chat, case)]
    engine = ScriptedEngine([ScriptedOutput(ids, [-0.5] * len(ids)) for ids in turns])
    runner = RolloutRunner(
        engine, tokenizer, [calculator_tool()], config=_config(case, named=False)
    )
    assert runner.chat.family.name == case.family
    [trajectory] = anyio.run(runner.run, [case.prompt])
    _check_trajectory(trajectory, runner.chat)
    ids = [*trajectory.prompt_ids, *trajectory.response_ids]
    assert ids[: len(trajectory.prompt_ids)] == chat.render_prompt(case.prompt)
    assert trajectory.response_ids[: len(turns[0])] == turns[0]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_generate_cli_with_family(case: Case, tmp_path: Path) -> None:
    from toolrollout.apps.cli import app

    tokenizer = _tokenizer(case)
    model_dir = tmp_path / "model"
    tokenizer.save_pretrained(model_dir)
    chat = _format(tokenizer, case)
    turns = [chat.encode(text) for text in _model_texts(chat, case)]
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text(
        json.dumps({"messages": case.prompt, "answer": "5"}) + "\n", encoding="utf-8"
    )
    out = tmp_path / "out.jsonl"
    args = ["generate", "--model", str(model_dir), "--dataset", str(dataset), "--n", "1"]
    args += ["--out", str(out), "--family", case.family, "--max-turns", "4"]
    if case.template_kwargs:
        args += ["--chat-template-kwargs", json.dumps(case.template_kwargs)]
    with scripted_sglang_server(turns, chat.stop_token_ids) as (url, log):
        result = CliRunner().invoke(app, [*args, "--engine-url", url])
    assert result.exit_code == 0, result.output
    [row] = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert row["status"] == "completed" and row["num_tool_calls"] == 1
    assert row["parse_errors"] == 0 and row["reward"] == 1.0
    assert json.loads(row["metrics"])["drift_mismatches"] == 0
    assert log[0]["input_ids"] == chat.render_prompt(case.prompt)  # the family's prompt was sent


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_trl_adapter_with_family(case: Case) -> None:
    tokenizer = _tokenizer(case)
    chat = _format(tokenizer, case)
    turns = [chat.encode(text) for text in _model_texts(chat, case)]
    engine = ScriptedEngine([ScriptedOutput(ids, [-0.5] * len(ids)) for ids in turns])
    trainer = SimpleNamespace(
        args=SimpleNamespace(max_completion_length=None),
        model=SimpleNamespace(training=True),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
    )
    rollout = trl_rollout_func(
        engine,
        tokenizer,
        RunSpec(
            tools=[calculator_tool()],
            config=RolloutConfig(family=case.family, chat_template_kwargs=case.template_kwargs),
        ),
    )
    with rollout:
        out = rollout([case.prompt], trainer)
        [trajectory] = rollout.last_trajectories
    _check_trajectory(trajectory, rollout.runner.chat)
    ids, mask = out["completion_ids"][0], out["env_mask"][0]
    assert ids == list(trajectory.response_ids)
    assert [t for t, m in zip(ids, mask, strict=True) if m == 1] == [*turns[0], *turns[1]]
    assert out["num_tool_calls"] == [1]
