"""The bundled vision-language demo: a tiny Qwen2-VL model and synthetic videos.

The model folder starts from :mod:`toolrollout.apps.demo_vl.build` (the trained language weights
of the calculator-only text demo, ``text_base/`` in a source checkout; the three Qwen2-VL
vision tokens; a seeded one-block ViT; the Pillow image processor) and is fine-tuned by
:mod:`toolrollout.apps.demo_vl.train` to call ``crop_video`` on a synthetic clip and name the
colour it sees in the frames. It runs the whole multimodal path on a CPU: placeholder
expansion, ``image_data`` through ``toolrollout serve``, images in the trajectory files (see
docs/multimodal.md). :mod:`toolrollout.apps.demo_vl.video` writes the synthetic clips that
``crop_video`` looks at.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

__all__ = ["DEMO_VL_MODEL_PATH", "DEMO_VL_TEXT_BASE_PATH"]

DEMO_VL_MODEL_PATH: Final[Path] = Path(__file__).resolve().parent / "model"
"""Hugging Face folder of the VL demo (config, weights, tokenizer, image processor)."""

DEMO_VL_TEXT_BASE_PATH: Final[Path] = Path(__file__).resolve().parent / "text_base"
"""The text model the VL demo was built from: the calculator-only text demo (0.36M), kept
unchanged in the source tree so that the VL build stays reproducible while the text demo
moves on. Not in the wheel; :mod:`toolrollout.apps.demo_vl.build` says how git recreates it."""
