"""One composition root: RunSpec checks, the library policies, and one runner construction."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from transformers import AutoTokenizer

from toolrollout import UserError
from toolrollout.apps.demo import DEMO_MODEL_PATH
from toolrollout.apps.demo_vl import DEMO_VL_MODEL_PATH
from toolrollout.chat import VisionFormat
from toolrollout.integrations import trl_rollout_func
from toolrollout.rewards import exact_match, numeric_match
from toolrollout.rollout import RolloutConfig, RolloutRunner
from toolrollout.rollout._compat import check_leftover_matches, leftover_info
from toolrollout.rollout._defaults import detect_vision
from toolrollout.spec import RunSpec, build_runner, default_rewards, load_components
from toolrollout.spec._spec import FieldError
from toolrollout.testing import ScriptedEngine, ScriptedOutput
from toolrollout.tools import calculator_tool

SRC = Path(__file__).resolve().parents[1] / "src" / "toolrollout"
BUILDER = SRC / "spec" / "_open.py"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(DEMO_MODEL_PATH))


def _runner_constructions(path: Path) -> Iterator[int]:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name == "RolloutRunner":
                yield node.lineno


def test_only_the_builder_constructs_a_rollout_runner() -> None:
    places = [
        f"{path.relative_to(SRC)}:{line}"
        for path in sorted(SRC.rglob("*.py"))
        if path != BUILDER
        for line in _runner_constructions(path)
    ]
    assert places == [], "construct runners with toolrollout.spec.build_runner / open_run"
    assert list(_runner_constructions(BUILDER))  # the one place is still there


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"config": RolloutConfig(tool_parser="klingon")}, "config.tool_parser"),
        ({"resume": True, "target_groups": 2}, "target_groups"),
        ({"target_groups": 0}, "target_groups"),
        ({"threads": 0}, "threads"),
        ({"retries": 0}, "retries"),
        ({"flush_every": 0}, "flush_every"),
        ({"request_timeout": 0.0}, "request_timeout"),
        ({"tool_error_penalty": -1.0}, "tool_error_penalty"),
        ({"tools": (), "tool_config": Path("t.yaml")}, "tool_config"),
        ({"interactions": {}, "interaction_config": Path("i.yaml")}, "interaction_config"),
        ({"vision": "maybe"}, "vision"),
        ({"rewards": "best"}, "rewards"),
        ({"engine_urls": ("",)}, "engine_urls"),
        ({"engine": "vllm"}, "engine_urls"),
    ],
)
def test_run_spec_errors_are_one_line_naming_the_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(FieldError) as error:
        RunSpec(**changes)
    message = str(error.value)
    assert field in message and "\n" not in message
    assert field in error.value.fields  # an application shows it under its own name


def test_run_spec_replace_checks_again_and_stores_plain_types() -> None:
    spec = RunSpec(engine_urls=["http://a:1"], model="m", tool_config="t.yaml")  # type: ignore[arg-type]
    assert spec.engine_urls == ("http://a:1",)
    assert spec.model == Path("m") and spec.tool_config == Path("t.yaml")
    with pytest.raises(UserError, match="threads"):
        spec.replace(threads=0)


def test_default_rewards_numeric_when_every_truth_is_a_number() -> None:
    assert default_rewards(["12", "1,024", 3.5, None]) == [numeric_match]
    assert default_rewards(["12", "Paris"]) == [exact_match]
    assert default_rewards([None]) == []
    [match, penalty] = default_rewards(["1"], tool_error_penalty=0.5)
    assert match is numeric_match and callable(penalty)
    spec = RunSpec(tool_error_penalty=0.25)
    assert spec.rewards_for(["x"])[0] is exact_match and len(spec.rewards_for(["x"])) == 2
    assert RunSpec(rewards=(numeric_match,)).rewards_for(["Paris"]) == (numeric_match,)


def test_vision_is_detected_from_the_model_folder() -> None:
    assert detect_vision(DEMO_MODEL_PATH) is None
    assert isinstance(detect_vision(DEMO_VL_MODEL_PATH), VisionFormat)
    assert detect_vision(DEMO_VL_MODEL_PATH, "off") is None
    with pytest.raises(UserError, match=r"preprocessor_config\.json"):
        detect_vision(DEMO_MODEL_PATH, "on")


def test_build_runner_wires_the_spec(tokenizer: Any) -> None:
    engine = ScriptedEngine([])
    spec = RunSpec(
        model=DEMO_VL_MODEL_PATH,
        interaction_config=REPO / "tool_configs" / "interactions.yaml",
        config=RolloutConfig(max_turns=3),
    )
    runner = build_runner(spec, engine, tokenizer=tokenizer, context_length=99)
    assert isinstance(runner, RolloutRunner)
    assert set(runner.interactions) == {"grader", "gsm8k"}
    assert isinstance(runner.vision, VisionFormat)
    assert list(runner.tools.tools) == ["calculator"]  # the default tool, as in the CLI
    assert runner.context_length == 99 and runner.config.max_turns == 3


def test_build_runner_passes_the_spec_hooks(tokenizer: Any) -> None:
    from toolrollout import TrajectoryHooks

    class Quiet(TrajectoryHooks):
        pass

    hooks = Quiet()
    runner = build_runner(RunSpec(hooks=hooks), ScriptedEngine([]), tokenizer=tokenizer)
    assert runner.hooks is hooks
    default = build_runner(RunSpec(), ScriptedEngine([]), tokenizer=tokenizer)
    assert type(default.hooks) is TrajectoryHooks


def test_leftover_compatibility_names_what_differs(tokenizer: Any) -> None:
    info = leftover_info(
        n=2, tool_names=["calculator"], tool_parser="qwen25", tokenizer=tokenizer, model="m"
    )
    check_leftover_matches(
        "l.parquet", info, tool_names=["calculator"], tool_parser="qwen25", tokenizer=tokenizer
    )
    with pytest.raises(UserError, match="with tools"):
        check_leftover_matches("l.parquet", info, tool_names=["python"], tool_parser="qwen25")
    with pytest.raises(FieldError, match=r"config\.tool_parser 'qwen25'") as error:
        check_leftover_matches("l.parquet", info, tool_names=["calculator"], tool_parser="llama3")
    assert error.value.fields == ("config.tool_parser",)
    with pytest.raises(UserError, match="another tokenizer"):
        check_leftover_matches(
            "l.parquet",
            {**info, "tokenizer": "0" * 16},
            tool_names=["calculator"],
            tool_parser="qwen25",
            tokenizer=tokenizer,
        )


def _say(tokenizer: Any, *texts: str) -> ScriptedEngine:
    outputs = []
    for text in texts:
        ids = [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
        outputs.append(ScriptedOutput(ids, logprobs=[-0.25] * len(ids)))
    return ScriptedEngine(outputs)


def test_a_runner_built_directly_has_the_builders_defaults(tokenizer: Any) -> None:
    """RolloutRunner(...) and build_runner(RunSpec(...)) give one behaviour: the reward the
    ground truths call for, the engine's context length, vision from the model folder."""
    row = {"messages": [{"role": "user", "content": "What is 2 + 3?"}], "answer": "5"}
    say = "The answer is 5."

    async def main() -> list[tuple[float | None, int | None]]:
        out = []
        for build in ("direct", "builder"):
            engine = _say(tokenizer, say)
            engine.context_length = 200
            runner = (
                RolloutRunner(engine, tokenizer, [calculator_tool()])
                if build == "direct"
                else build_runner(RunSpec(), engine, tokenizer=tokenizer)
            )
            before = runner.context_length
            assert before is None  # not asked before the first call
            [trajectory] = await runner.run([row])
            out.append((trajectory.reward, runner.context_length))
        return out

    direct, built = anyio.run(main)
    assert direct == built == (1.0, 200)
    vl = AutoTokenizer.from_pretrained(str(DEMO_VL_MODEL_PATH))
    direct_vl = RolloutRunner(ScriptedEngine([]), vl, [])
    built_vl = build_runner(RunSpec(tools=()), ScriptedEngine([]), tokenizer=vl)
    assert isinstance(direct_vl.vision, VisionFormat) and isinstance(built_vl.vision, VisionFormat)
    assert RolloutRunner(ScriptedEngine([]), tokenizer, []).vision is None


def test_trl_adapter_runs_interactions_from_a_real_config(tokenizer: Any) -> None:
    engine = _say(tokenizer, "The answer is 4.", "The answer is 5.")
    row = {
        "prompt": [{"role": "user", "content": "What is 2 + 3?"}],
        "answer": "5",
        "extra_info": {"interaction_kwargs": {"name": "grader"}},
    }
    with trl_rollout_func(
        engine,
        tokenizer,
        RunSpec(
            tools=[calculator_tool()],
            interaction_config=REPO / "tool_configs" / "interactions.yaml",
        ),
    ) as rollout:
        out = rollout([row])
        [trajectory] = rollout.last_trajectories
    assert trajectory.turn_rewards == (0.0, 1.0)  # graded wrong, then right
    roles = [m["role"] for m in trajectory.messages]
    assert roles == ["user", "assistant", "user", "assistant"]  # the retry message between
    assert len(out["completion_ids"][0]) == len(out["env_mask"][0])
    assert 0 in out["env_mask"][0]  # the grader's retry message is not trained on


def test_trl_adapter_passes_vision_through(tokenizer: Any) -> None:
    engine = ScriptedEngine([])
    auto = trl_rollout_func(engine, tokenizer, RunSpec(tools=[], model=DEMO_VL_MODEL_PATH))
    assert isinstance(auto.runner.vision, VisionFormat)
    given = VisionFormat.from_pretrained(DEMO_VL_MODEL_PATH)
    assert (
        trl_rollout_func(engine, tokenizer, RunSpec(tools=[], vision=given)).runner.vision is given
    )
    assert trl_rollout_func(engine, tokenizer, RunSpec(tools=[])).runner.vision is None


def test_load_components_without_a_folder_leaves_vision_off(tokenizer: Any) -> None:
    components = load_components(RunSpec(tools=()), tokenizer=tokenizer)
    assert components.vision is None and components.tools == () and components.interactions == {}
