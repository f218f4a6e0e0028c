"""Interaction configs in verl's layout, and the built-in graders."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from toolrollout.exceptions import ConfigError, InteractionError
from toolrollout.interactions import (
    GraderInteraction,
    Gsm8kInteraction,
    InteractionReply,
    load_interaction_config,
)
from toolrollout.interactions._config import interactions_from_config

# verl's examples/sglang_multiturn/config/interaction_config/gsm8k_interaction_config.yaml
VERL_GSM8K = """interaction:
  - name: "gsm8k"
    class_name: "verl.interactions.gsm8k_interaction.Gsm8kInteraction"
    config: {}
"""


class PlainInteraction:
    """Shaped like verl's BaseInteraction without inheriting from anything of ours."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    async def start_interaction(self, instance_id: str | None = None, **kwargs: Any) -> str:
        return instance_id or "x"

    async def generate_response(self, instance_id: str, messages: Any, **kwargs: Any) -> Any:
        return True, "bye", 1.0, {}

    async def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        return None


@pytest.fixture(autouse=True)
def fake_module(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    module = types.ModuleType("fake_envs")
    module.PlainInteraction = PlainInteraction  # type: ignore[attr-defined]
    module.WeatherInteraction = PlainInteraction  # type: ignore[attr-defined]
    module.not_a_class = len  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_envs", module)
    yield


def test_verl_gsm8k_config_loads_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "gsm8k_interaction_config.yaml"
    path.write_text(VERL_GSM8K)
    interactions = load_interaction_config(path)
    assert list(interactions) == ["gsm8k"]
    assert isinstance(interactions["gsm8k"], Gsm8kInteraction)
    assert interactions["gsm8k"].name == "gsm8k"


def test_names_default_like_verl_and_config_reaches_the_class() -> None:
    built = interactions_from_config(
        {
            "interaction": [
                {"class_name": "fake_envs.WeatherInteraction", "config": {"city": "Oslo"}},
                {"class_name": "fake_envs.PlainInteraction"},
                {
                    "name": "demo",
                    "class_name": "toolrollout.interactions.GraderInteraction",
                    "config": {"max_retries": 4},
                },
            ]
        }
    )
    assert list(built) == ["weather", "plain", "demo"]
    assert built["weather"].config == {"city": "Oslo", "name": "weather"}
    assert isinstance(built["demo"], GraderInteraction) and built["demo"].max_retries == 4


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"interactions": []}, "interaction: is required"),
        ({"interaction": [{"class_name": "fake_envs.Nope"}]}, "interaction[0].class_name: cannot"),
        (
            {"interaction": [{"class_name": "fake_envs.not_a_class"}]},
            "is not an interaction class",
        ),
        (
            {
                "interaction": [
                    {"class_name": "fake_envs.PlainInteraction", "name": "a"},
                    {"class_name": "fake_envs.WeatherInteraction", "name": "a"},
                ]
            },
            "interaction[1].name: duplicate interaction name 'a'",
        ),
        (
            {
                "interaction": [
                    {
                        "class_name": "toolrollout.interactions.GraderInteraction",
                        "config": {"max_retries": -1},
                    }
                ]
            },
            "interaction[0].config: max_retries must be a non-negative integer",
        ),
        ([], "expected a mapping"),
    ],
)
def test_config_errors_name_the_key(data: Any, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        interactions_from_config(data, source="env.yaml")
    assert message in str(info.value) and str(info.value).startswith("env.yaml")


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_interaction_config(tmp_path / "nope.yaml")


async def test_grader_retries_then_gives_up() -> None:
    grader = GraderInteraction({"max_retries": 1, "name": "g"})
    await grader.start_interaction("t", ground_truth="42")
    wrong = [{"role": "assistant", "content": "It is 41."}]
    right = [{"role": "assistant", "content": "So 42."}]
    assert await grader.generate_response("t", right) == InteractionReply(
        True, "Correct.", 1.0, {"attempts": 1}
    )
    first = await grader.generate_response("t", wrong)
    second = await grader.generate_response("t", wrong)
    assert (first.done, first.reward) == (False, 0.0)
    assert (second.done, second.reward) == (True, 0.0)
    assert await grader.calculate_score("t") == 0.0
    await grader.finalize_interaction("t")
    with pytest.raises(InteractionError, match="ground truth"):
        await grader.start_interaction("u")


async def test_gsm8k_interaction_needs_the_strict_format() -> None:
    gsm8k = Gsm8kInteraction({"name": "gsm8k"})
    assert gsm8k.max_retries is None
    await gsm8k.start_interaction("t", ground_truth="1,234")
    plain = await gsm8k.generate_response("t", [{"role": "assistant", "content": "1234"}])
    strict = await gsm8k.generate_response("t", [{"role": "assistant", "content": "#### 1234"}])
    assert (plain.done, plain.reward) == (False, 0.0)
    assert (strict.done, strict.reward) == (True, 1.0)


def test_shipped_example_loads() -> None:
    path = Path(__file__).resolve().parents[2] / "tool_configs" / "interactions.yaml"
    built = load_interaction_config(path)
    assert sorted(built) == ["grader", "gsm8k"]
    assert built["grader"].max_retries == 2
