"""Images inside token-exact transcripts: preparation and placeholder expansion.

:class:`VisionFormat` resizes each image to the processor's own grid and repeats its
placeholder on token ids as the model's processor would, reporting where each image's run
sits (docs/multimodal.md). Preparation is blocking: callers on an event loop run it in a
worker thread (:func:`toolrollout.rollout._images.prepare_images`).
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._exceptions import ConfigError, ImageError
from .._extras import require_extra

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["ImageRun", "PreparedImage", "VisionFormat", "load_image"]

VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"


@dataclass(frozen=True, slots=True)
class PreparedImage:
    """One image as the model will see it: resized to the grid, PNG-encoded."""

    png: bytes
    """The resized RGB image as PNG (what is sent and what is stored)."""
    width: int
    height: int
    grid_thw: tuple[int, int, int]
    """The processor's ``image_grid_thw`` row for this image (in patches)."""
    num_tokens: int
    """Placeholder tokens this image expands to."""

    @property
    def data_url(self) -> str:
        """``data:image/png;base64,...``: one of the forms SGLang's ``image_data`` accepts."""
        return "data:image/png;base64," + base64.b64encode(self.png).decode("ascii")


@dataclass(frozen=True, slots=True)
class ImageRun:
    """Where one image's placeholder run sits in a list of ids (``ids[start:end]``)."""

    start: int
    end: int

    @property
    def num_tokens(self) -> int:
        return self.end - self.start


def load_image(data: Any) -> Any:
    """Turn a PIL image, encoded bytes, a base64 string, a data URL or a path into RGB PIL.

    Raises :class:`~toolrollout.exceptions.ImageError` with a one-line reason for anything
    that is not a readable image.
    """
    require_extra("vision", "images from tools", "PIL")
    from PIL import Image, UnidentifiedImageError

    if isinstance(data, Image.Image):
        image = data
    else:
        raw = b""  # an empty string or data URL: "0 bytes ... not a readable image"
        if isinstance(data, bytes | bytearray | memoryview):
            raw = bytes(data)
        elif isinstance(data, str):
            text = data.strip()
            if text.startswith("data:"):
                _, _, text = text.partition(",")
            elif len(text) < 4096 and os.path.isfile(text):
                raw = Path(text).read_bytes()
                text = ""
            if text:
                try:
                    raw = base64.b64decode(text, validate=True)
                except (binascii.Error, ValueError) as exc:
                    raise ImageError("image data is neither base64 nor an existing file") from exc
        else:
            raise ImageError(f"cannot read an image from a {type(data).__name__}")
        try:
            image = Image.open(io.BytesIO(raw))
            image.load()
        except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
            raise ImageError(f"{len(raw)} bytes of image data are not a readable image") from exc
    if image.width < 1 or image.height < 1:
        raise ImageError(f"image has no pixels ({image.width}x{image.height})")
    return image.convert("RGB")


def _grid_size(
    height: int, width: int, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """Qwen2-VL's resize rule: sides multiples of ``factor``, area within the bounds."""
    if max(height, width) / min(height, width) > 200:
        raise ImageError(f"image aspect ratio {width}x{height} is beyond 200:1")
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


class VisionFormat:
    """Placeholder ids and image preparation for one Qwen2-VL-family tokenizer + processor.

    Immutable and shared by every trajectory of a run, like :class:`ChatFormat`.
    """

    __slots__ = (
        "_max_pixels",
        "_merge",
        "_min_pixels",
        "_patch",
        "end_id",
        "pad_id",
        "start_id",
    )

    def __init__(self, tokenizer: PreTrainedTokenizerBase, image_processor: Any) -> None:
        ids = {}
        for token in (VISION_START, VISION_END, IMAGE_PAD):
            encoded = tokenizer.encode(token, add_special_tokens=False)
            if len(encoded) != 1:
                raise ConfigError(
                    f"the tokenizer has no single {token} token; not a Qwen2-VL model"
                )
            ids[token] = int(encoded[0])
        self.start_id: int = ids[VISION_START]
        self.end_id: int = ids[VISION_END]
        self.pad_id: int = ids[IMAGE_PAD]
        self._patch = int(image_processor.patch_size)
        self._merge = int(image_processor.merge_size)
        size: Any = getattr(image_processor, "size", None) or {}
        low: Any = size.get("shortest_edge") or getattr(image_processor, "min_pixels", 3136)
        high: Any = size.get("longest_edge") or getattr(image_processor, "max_pixels", 1003520)
        self._min_pixels = int(low)
        self._max_pixels = int(high)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike[str]) -> VisionFormat:
        """Read the tokenizer and the Pillow image processor of a model folder."""
        require_extra("vision", "a vision model's image processor")
        from transformers import AutoImageProcessor, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(path))
        auto: Any = AutoImageProcessor
        try:
            processor = auto.from_pretrained(str(path), backend="pil")
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path}: no usable image processor ({exc})") from exc
        return cls(tokenizer, processor)

    @property
    def factor(self) -> int:
        """Side granularity in pixels (``patch_size * merge_size``)."""
        return self._patch * self._merge

    def prepare(self, data: Any) -> PreparedImage:
        """Decode, convert to RGB, resize to the grid and PNG-encode one image (blocking)."""
        from PIL import Image

        image = load_image(data)
        height, width = _grid_size(
            image.height, image.width, self.factor, self._min_pixels, self._max_pixels
        )
        if (width, height) != image.size:
            image = image.resize((width, height), resample=Image.Resampling.BICUBIC)
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        grid = (1, height // self._patch, width // self._patch)
        return PreparedImage(
            png=buffer.getvalue(),
            width=width,
            height=height,
            grid_thw=grid,
            num_tokens=grid[0] * grid[1] * grid[2] // (self._merge * self._merge),
        )

    def expand(
        self, ids: Sequence[int], tokens_per_image: Sequence[int]
    ) -> tuple[list[int], list[ImageRun]]:
        """Repeat each image's lone ``<|image_pad|>`` to its token count.

        ``ids`` is a template render with one pad per image (between vision start/end), in
        image order. Returns the expanded ids and each image's run in them.
        """
        out: list[int] = []
        runs: list[ImageRun] = []
        count = 0
        for position, token in enumerate(ids):
            if token != self.pad_id:
                out.append(token)
                continue
            if (
                position == 0
                or ids[position - 1] != self.start_id
                or position + 1 >= len(ids)
                or ids[position + 1] != self.end_id
            ):
                raise ImageError("an <|image_pad|> token outside <|vision_start|>...<|vision_end|>")
            if count >= len(tokens_per_image):
                raise ImageError(
                    "the render has more image placeholders than the "
                    f"{len(tokens_per_image)} images given"
                )
            start = len(out)
            out.extend([self.pad_id] * tokens_per_image[count])
            runs.append(ImageRun(start, len(out)))
            count += 1
        if count != len(tokens_per_image):
            raise ImageError(
                f"the render has {count} image placeholders for {len(tokens_per_image)} images"
            )
        return out, runs

    def runs(self, ids: Sequence[int]) -> list[ImageRun]:
        """Every placeholder run in ``ids`` (already expanded), in order."""
        found: list[ImageRun] = []
        start: int | None = None
        for position, token in enumerate(ids):
            if token == self.pad_id and start is None:
                start = position
            elif token != self.pad_id and start is not None:
                found.append(ImageRun(start, position))
                start = None
        if start is not None:
            found.append(ImageRun(start, len(ids)))
        return found

    def collapse(self, ids: Sequence[int]) -> list[int]:
        """Undo :meth:`expand`: one ``<|image_pad|>`` per run (what the template renders)."""
        return [
            t for i, t in enumerate(ids) if t != self.pad_id or i == 0 or ids[i - 1] != self.pad_id
        ]

    @staticmethod
    def content(text: str, num_images: int) -> list[dict[str, Any]]:
        """Multimodal message content: the images first, then the text."""
        parts: list[dict[str, Any]] = [{"type": "image"} for _ in range(num_images)]
        parts.append({"type": "text", "text": text})
        return parts
