"""The defaults a runner takes from its inputs: which reward, whether the model sees images
(one set of rules for every way a runner is built).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from toolrollout._exceptions import FieldError, UserError

if TYPE_CHECKING:
    from toolrollout.chat import VisionFormat
    from toolrollout.rewards import WeightedReward


__all__ = ["VisionMode", "default_rewards", "detect_vision", "is_number", "tokenizer_folder"]

VisionMode = Literal["auto", "on", "off"]
"""``auto``: images go into the context when the model folder has a
``preprocessor_config.json`` (a vision-language model); ``on``: always (the folder must
have one); ``off``: never."""


def is_number(value: object) -> bool:
    """Whether a ground truth reads as a number (then answers are scored numerically)."""
    try:
        float(str(value).replace(",", ""))
    except ValueError:
        return False
    return True


def default_rewards(
    ground_truths: Iterable[object], *, tool_error_penalty: float = 0.0
) -> list[Any]:
    """The reward terms for rows with these ground truths.

    Numbers compare as numbers ("The answer is 12.0" matches ``12``): ``numeric_match``
    when every truth reads as one, else ``exact_match``; no truths, no match term. A
    positive ``tool_error_penalty`` adds that penalty per failed or malformed tool call.
    """
    from toolrollout.rewards import exact_match, numeric_match
    from toolrollout.rewards import tool_error_penalty as penalty

    truths = [t for t in ground_truths if t is not None]
    terms: list[WeightedReward | Any] = []
    if truths:
        terms.append(numeric_match if all(is_number(t) for t in truths) else exact_match)
    if tool_error_penalty > 0:
        terms.append(penalty(tool_error_penalty))
    return terms


def detect_vision(
    model_path: str | Path | None, mode: VisionMode | VisionFormat = "auto"
) -> VisionFormat | None:
    """The image format of a vision-language model folder, or ``None`` for a text model.

    ``auto`` looks for the ``preprocessor_config.json`` a VL model folder carries; ``on``
    requires one; ``off`` is ``None``. A :class:`~toolrollout.chat.VisionFormat` is used
    as it is.
    """
    if not isinstance(mode, str):
        return mode
    if mode == "off":
        return None
    if model_path is None:
        if mode == "on":
            raise FieldError(
                "{vision} 'on' needs the {model} folder to read its image format",
                "vision",
                "model",
            )
        return None
    folder = Path(model_path)
    if not (folder / "preprocessor_config.json").is_file():
        if mode == "on":
            raise UserError(f"vision 'on': {folder} has no preprocessor_config.json")
        return None
    from toolrollout.chat import VisionFormat

    return VisionFormat.from_pretrained(folder)


def tokenizer_folder(tokenizer: Any) -> str | None:
    """The folder a tokenizer was loaded from (``name_or_path``), where it is one."""
    path = getattr(tokenizer, "name_or_path", None)
    return str(path) if path and Path(str(path)).is_dir() else None
