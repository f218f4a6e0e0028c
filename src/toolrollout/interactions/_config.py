"""Interaction-config files in verl's layout: ``interaction: [{name, class_name, config}]``.

Names follow verl's rule (``Gsm8kInteraction`` -> ``gsm8k``) and are put into the config.
"""

from __future__ import annotations

from collections.abc import Mapping
from os import PathLike
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from toolrollout._exceptions import ConfigError, UserError
from toolrollout.tools._config import _validation_error, import_entry, read_yaml_file

from ._base import Interaction

__all__ = ["VERL_INTERACTIONS", "interactions_from_config", "load_interaction_config"]

VERL_INTERACTIONS: Mapping[str, str] = {
    "verl.interactions.gsm8k_interaction.Gsm8kInteraction": (
        "toolrollout.interactions.Gsm8kInteraction"
    ),
}
"""verl interaction classes that load as a toolrollout interaction (verl not needed)."""


class _EntryModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    class_name: str
    config: dict[str, Any] = Field(default_factory=dict)


class _FileModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    interaction: list[_EntryModel]


def _default_name(class_name: str) -> str:
    simple = class_name.replace(":", ".").rsplit(".", 1)[-1]
    if simple.endswith("Interaction") and simple != "Interaction":
        simple = simple[: -len("Interaction")]
    return simple.lower()


def _is_interaction_class(obj: object) -> bool:
    """An :class:`Interaction` subclass, or a class shaped like verl's ``BaseInteraction``."""
    if not isinstance(obj, type):
        return False
    if issubclass(obj, Interaction):
        return True
    return all(
        callable(getattr(obj, m, None))
        for m in ("start_interaction", "generate_response", "finalize_interaction")
    )


def interactions_from_config(
    data: object, *, source: str = "<interaction config>"
) -> dict[str, Any]:
    """Build the interactions of an already-parsed config, by name."""
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{source}: expected a mapping with an 'interaction' list, got {type(data).__name__}"
        )
    try:
        parsed = _FileModel.model_validate(data)
    except ValidationError as exc:
        raise _validation_error(source, exc) from exc
    built: dict[str, Any] = {}
    for index, entry in enumerate(parsed.interaction):
        where = f"{source}: interaction[{index}]"
        class_name = entry.class_name.strip()
        target, cls = import_entry(class_name, f"{where}.class_name", VERL_INTERACTIONS)
        if not _is_interaction_class(cls):
            raise ConfigError(
                f"{where}.class_name: {target!r} is not an interaction class "
                "(subclass toolrollout.interactions.Interaction)"
            )
        name = entry.name or _default_name(class_name)
        if name in built:
            raise ConfigError(f"{where}.name: duplicate interaction name {name!r}")
        config = {**entry.config, "name": name}
        try:
            built[name] = cls(config=config)  # type: ignore[operator]
        except UserError as exc:
            raise ConfigError(f"{where}.config: {exc}") from exc
        except Exception as exc:  # the class's own constructor failed: say where
            raise ConfigError(
                f"{where}.class_name: building {target!r} failed: {type(exc).__name__}: {exc}"
            ) from exc
    return built


def load_interaction_config(path: str | PathLike[str]) -> dict[str, Any]:
    """Load a verl-layout interaction config YAML: interaction objects by name."""
    return interactions_from_config(read_yaml_file(path), source=str(path))
