"""``image_data`` for the embedded engine, handled as SGLang's Qwen-VL processor does.

Every ``<|vision_start|>(<|image_pad|>)+<|vision_end|>`` run is collapsed, one image per run
checked, and expanded again from the image's grid. CPU work on pixels: the engine runs it in
a worker thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from toolrollout._exceptions import EngineRequestRejected, ImageError
from toolrollout.chat import VisionFormat

__all__ = ["VisionInputs", "VisionProcessor"]


@dataclass(frozen=True, slots=True)
class VisionInputs:
    """What the model needs besides the (expanded) ids to prefill a request with images."""

    input_ids: list[int]
    pixel_values: torch.Tensor
    image_grid_thw: torch.Tensor
    mm_token_type_ids: torch.Tensor
    """1 where an id is an image placeholder, else 0 (``[1, len(input_ids)]``)."""


class VisionProcessor:
    """The tokenizer's vision ids plus the model folder's Pillow image processor."""

    def __init__(self, model_path: str, tokenizer: Any) -> None:
        from transformers import AutoImageProcessor

        auto: Any = AutoImageProcessor
        self._processor = auto.from_pretrained(model_path, backend="pil")
        self.format = VisionFormat(tokenizer, self._processor)

    def process(self, input_ids: Sequence[int], image_data: Sequence[Any]) -> VisionInputs:
        """Expand ``input_ids`` for ``image_data`` and compute the pixel inputs (HTTP 400 for
        unreadable images or placeholder runs that do not match them)."""
        fmt = self.format
        collapsed = fmt.collapse(list(input_ids))
        runs = collapsed.count(fmt.pad_id)
        if runs != len(image_data):
            raise EngineRequestRejected(
                f"input_ids hold {runs} image placeholder run(s) but image_data has "
                f"{len(image_data)} image(s); give one image per "
                "<|vision_start|><|image_pad|><|vision_end|>.",
                status_code=400,
            )
        try:
            prepared = [fmt.prepare(item) for item in image_data]
            ids, _ = fmt.expand(collapsed, [image.num_tokens for image in prepared])
        except ImageError as exc:
            raise EngineRequestRejected(f"image_data: {exc}", status_code=400) from exc
        from toolrollout.chat._multimodal import load_image

        pil = [load_image(image.png) for image in prepared]
        out = self._processor(images=pil)
        grid = torch.as_tensor(out["image_grid_thw"], dtype=torch.long)
        expected = [image.grid_thw for image in prepared]
        if [tuple(int(x) for x in row) for row in grid.tolist()] != expected:
            raise EngineRequestRejected(
                f"the image processor made grids {grid.tolist()}, expected {expected}",
                status_code=400,
            )
        types = torch.tensor([[1 if t == fmt.pad_id else 0 for t in ids]], dtype=torch.int)
        return VisionInputs(
            input_ids=ids,
            pixel_values=torch.as_tensor(out["pixel_values"], dtype=torch.float32),
            image_grid_thw=grid,
            mm_token_type_ids=types,
        )
