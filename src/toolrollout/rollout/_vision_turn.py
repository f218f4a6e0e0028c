"""The image side of a tool turn: :func:`attach_images` puts the images of a turn's tool
results into its messages (within the image budgets), :func:`record_images` keeps each one
with its span once the expanded delta is appended.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from toolrollout._exceptions import ImageError
from toolrollout._records import TrajectoryImage
from toolrollout.tools import ToolResult

from ._images import prepare_images

if TYPE_CHECKING:
    from toolrollout.chat import VisionFormat
    from toolrollout.chat._multimodal import ImageRun, PreparedImage

    from ._config import RolloutConfig

__all__ = ["ImageLedger", "attach_images", "record_images"]


@dataclass(slots=True)
class ImageLedger:
    """The images one trajectory has placed so far (mutated by its own task only)."""

    images: list[TrajectoryImage] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)
    """``image_data`` entries for the engine, one per placed image, in order."""
    dropped: int = 0
    """Images not shown to the model (budget, no vision, unreadable)."""

    @property
    def tokens(self) -> int:
        return sum(image.num_tokens for image in self.images)


async def attach_images(
    vision: VisionFormat | None,
    config: RolloutConfig,
    ledger: ImageLedger,
    results: Sequence[ToolResult],
    messages: list[dict[str, Any]],
) -> tuple[list[PreparedImage], int]:
    """Give ``messages[i]`` the images of ``results[i]`` (those over the budgets left out,
    the message says so); return them and the new errors (unreadable images)."""
    placed: list[PreparedImage] = []
    errors = 0
    limits = (config.max_images, config.max_image_tokens)
    images_left, tokens_left = (math.inf if limit is None else limit for limit in limits)
    images_left -= len(ledger.images)
    tokens_left -= ledger.tokens
    for index, result in enumerate(results):
        if not result.images:
            continue
        message = messages[index]
        text = str(message["content"])
        if vision is None:
            ledger.dropped += len(result.images)
            message["content"] = (
                f"{text}\n[{len(result.images)} image(s) not shown: the model takes no images]"
            )
            continue
        prepared = await prepare_images(vision, result.images)
        broken = [p for p in prepared if isinstance(p, ImageError)]
        if broken:
            ledger.dropped += len(prepared)
            errors += 1
            message["content"] = f"Error: the tool returned an unreadable image: {broken[0]}"
            continue
        kept: list[PreparedImage] = []
        for image in prepared:
            assert not isinstance(image, ImageError)
            if images_left > 0 and image.num_tokens <= tokens_left:
                kept.append(image)
                images_left -= 1
                tokens_left -= image.num_tokens
        left_out = len(prepared) - len(kept)
        ledger.dropped += left_out
        if left_out:
            text += f"\n[{left_out} image(s) left out: the trajectory's image budget is used up]"
        message["content"] = vision.content(text, len(kept)) if kept else text
        placed.extend(kept)
    return placed, errors


def record_images(
    ledger: ImageLedger,
    images: Sequence[PreparedImage],
    runs: Sequence[ImageRun],
    offset: int,
) -> None:
    """Record the placed ``images`` whose runs start ``offset`` tokens into the sequence."""
    for image, run in zip(images, runs, strict=True):
        ledger.images.append(
            TrajectoryImage(
                png=image.png,
                start=offset + run.start,
                end=offset + run.end,
                grid_thw=image.grid_thw,
            )
        )
        ledger.urls.append(image.data_url)
