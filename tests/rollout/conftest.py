from __future__ import annotations

from typing import Any

import pytest

from toolrollout.apps.demo import DEMO_MODEL_PATH


@pytest.fixture(scope="session")
def demo_tokenizer() -> Any:
    from transformers import AutoTokenizer

    if not (DEMO_MODEL_PATH / "tokenizer_config.json").is_file():
        pytest.fail(f"the demo model is missing at {DEMO_MODEL_PATH}")
    return AutoTokenizer.from_pretrained(str(DEMO_MODEL_PATH))
