"""The converted SmolLM2 folder, shared by the tests of this package.

``.ci/setup`` converts it once (``python -m toolrollout.apps.demo_smollm.build``) into the
user's cache; a test that needs it fails with that command when it is missing, because
the tests here must not download anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from toolrollout.apps.demo_smollm import smollm2_model_dir
from toolrollout.apps.demo_smollm.build import weights_ok


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    folder = smollm2_model_dir()
    if not weights_ok(folder):
        pytest.fail(
            f"{folder}: no converted SmolLM2 with the pinned weights; run "
            "`python -m toolrollout.apps.demo_smollm.build` (.ci/setup does)"
        )
    return folder


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))
