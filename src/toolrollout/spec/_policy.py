"""The choices a run makes from its inputs: which reward, whether the model sees images.

They used to live in the CLI; here a Python caller gets the same defaults.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from toolrollout._exceptions import UserError

if TYPE_CHECKING:
    from toolrollout.chat import VisionFormat
    from toolrollout.rewards import WeightedReward


__all__ = ["VisionMode", "default_rewards", "detect_vision", "is_number", "load_tokenizer"]

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
            raise UserError("vision 'on' needs the model folder (--model) to read its image format")
        return None
    folder = Path(model_path)
    if not (folder / "preprocessor_config.json").is_file():
        if mode == "on":
            raise UserError(f"vision 'on': {folder} has no preprocessor_config.json")
        return None
    from toolrollout.chat import VisionFormat

    return VisionFormat.from_pretrained(folder)


def load_tokenizer(path: str | Path) -> Any:
    """The tokenizer of a model folder, or a one-line :class:`UserError` saying why not."""
    from toolrollout._extras import require_extra

    require_extra("cli", "loading a tokenizer from a model folder", "transformers")
    from transformers import AutoTokenizer

    folder = Path(path)
    if not folder.is_dir():
        raise UserError(f"model folder not found: {folder}")
    try:
        return AutoTokenizer.from_pretrained(str(folder))
    except Exception as exc:  # transformers raises many types for a bad folder
        raise UserError(f"cannot load a tokenizer from {folder}: {exc}") from exc
