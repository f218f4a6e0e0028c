from __future__ import annotations

from typing import Any

import pytest

from toolrollout.apps.demo import DEMO_MODEL_PATH


@pytest.fixture(scope="session")
def demo_tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(DEMO_MODEL_PATH))
