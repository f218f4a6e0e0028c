"""The run options are declared once (``apps/cli/_options.py``): each names the RunSpec field
it sets, the commands take them from there, and a field named by a library error is shown
as its flag."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from toolrollout.apps.cli import bench, gateway, generate
from toolrollout.apps.cli import eval as eval_cli
from toolrollout.apps.cli._options import RUN, Opt, spec_from, user_message
from toolrollout.spec import RunSpec
from toolrollout.spec._spec import FieldError

COMMANDS = {
    "generate": generate.OPTIONS,
    "eval": eval_cli.OPTIONS,
    "gateway": gateway.OPTIONS,
    "bench": bench.OPTIONS,
}


def _defaults(options: list[Opt], **values: Any) -> SimpleNamespace:
    return SimpleNamespace(**{**{o.name: o.default for o in options}, **values})


@pytest.mark.parametrize("option", RUN.values(), ids=lambda o: o.name)
def test_every_run_option_names_a_field_of_the_spec(option: Opt) -> None:
    node: Any = RunSpec()
    for part in (option.field or "").split(".") if option.field else ():
        assert part in {f.name for f in dataclasses.fields(node)}, option.field
        node = getattr(node, part)


@pytest.mark.parametrize("name", ["generate", "eval", "gateway"])
def test_the_defaults_of_each_command_make_a_spec(name: str) -> None:
    options = COMMANDS[name]
    spec = spec_from(_defaults(options), options, {"config.n": 1})
    assert spec.engine_urls == () and spec.model is None
    assert spec.request_timeout == 600.0


def test_each_value_lands_in_the_field_its_option_names() -> None:
    options = generate.OPTIONS
    values = _defaults(
        options,
        engine_url=["http://a:1"],
        max_turns=3,
        temperature=0.5,
        turn_reward_weight=0.25,
        finish_tools=True,
        chat_template_kwargs='{"enable_thinking": false}',
        schedule="priority",
        engine_api_key="",
    )
    spec = spec_from(values, options, {"config.n": 2})
    assert spec.engine_urls == ("http://a:1",) and spec.engine_api_key is None
    assert spec.config.max_turns == 3 and spec.config.n == 2
    assert spec.config.sampling.temperature == 0.5
    assert spec.config.sampling.max_new_tokens == 128
    assert spec.config.reward_mix.turn_weight == 0.25
    assert spec.config.tools_at_target == "finish"
    assert spec.config.chat_template_kwargs == {"enable_thinking": False}
    assert spec.config.scheduling is not None and spec.config.scheduling.priority


def test_shared_options_are_one_declaration() -> None:
    """eval changes only what differs (default, help); the flag and field are generate's."""
    by_name = {name: {o.name: o for o in opts} for name, opts in COMMANDS.items()}
    for option in ("engine_url", "max_turns", "tool_parser", "request_timeout"):
        assert by_name["eval"][option].field == by_name["generate"][option].field
        assert by_name["eval"][option].flag == by_name["generate"][option].flag
    assert by_name["eval"]["seed"].default == 0 and by_name["generate"]["seed"].default is None


def test_a_field_error_is_shown_with_the_flags() -> None:
    with pytest.raises(FieldError) as error:
        RunSpec(engine="sglang")
    assert str(error.value) == "engine sglang needs engine_urls (the server to use)"
    shown = user_message(error.value, generate.OPTIONS)
    assert shown == "--engine sglang needs --engine-url (the server to use)"
    # a field no option sets keeps its name; an error that names no field is left alone
    assert user_message(FieldError("rewards must be 'auto'", "rewards"), RUN.values()) == (
        "rewards must be 'auto'"
    )
    assert user_message(ValueError("engine down"), RUN.values()) == "engine down"
    # only the marked field is renamed, not the same word in a path or in prose
    path_error = FieldError("/ckpt/model: vision 'on' needs the {model} folder", "model")
    assert str(path_error) == "/ckpt/model: vision 'on' needs the model folder"
    assert user_message(path_error, RUN.values()) == (
        "/ckpt/model: vision 'on' needs the --model folder"
    )


def test_a_config_field_error_names_the_nested_field() -> None:
    from toolrollout.rollout import RolloutConfig

    with pytest.raises(FieldError) as error:
        RunSpec(config=RolloutConfig(tool_parser="klingon"))
    assert user_message(error.value, eval_cli.OPTIONS).startswith("unknown --tool-parser 'klingon'")


def test_help_lists_the_same_flags(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from toolrollout.apps.cli import app

    result = CliRunner().invoke(app, ["eval", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for flag in ("--engine-url", "--greedy", "--sampled", "--max-turns", "--failover-after"):
        assert flag in result.output
