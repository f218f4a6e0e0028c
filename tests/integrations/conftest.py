"""Shared fixtures: the demo tokenizer, and a scripted engine that calls the calculator once.

The scripted engine is the documented test seam (``toolrollout.testing``); every id it
returns is derived from the demo tokenizer, never hard-coded, so a retrained demo model
keeps these tests valid.
"""

from __future__ import annotations

from typing import Any

import pytest
from tests.integrations._scripted import calculator_script

from toolrollout.demo import DEMO_MODEL_PATH
from toolrollout.testing import ScriptedEngine


@pytest.fixture(scope="session")
def demo_tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(DEMO_MODEL_PATH))


@pytest.fixture
def scripted_engine(demo_tokenizer: Any) -> ScriptedEngine:
    return ScriptedEngine(calculator_script(demo_tokenizer))
