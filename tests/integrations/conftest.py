"""Shared fixtures: the demo tokenizer, and a scripted engine that calls the calculator once.

The scripted engine is the documented test seam (``toolrollout.testing``); every id it
returns is derived from the demo tokenizer, never hard-coded, so a retrained demo model
keeps these tests valid.

The verl and ms-swift test modules are collected only when their trainer imports; when it
does not, ``test_trainer_env.py`` fails with the import error (or skips, when
``TOOLROLLOUT_SKIP_TRAINER_TESTS=1`` opts out), so one missing package is one clear failure
instead of a collection error that stops the whole session.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.integrations._scripted import calculator_script
from tests.integrations._trainers import TRAINER_TEST_FILES, trainer_import_error

from toolrollout.apps.demo import DEMO_MODEL_PATH
from toolrollout.testing import ScriptedEngine

_HERE = Path(__file__).resolve().parent
_TRAINER_OF = {name: module for module, names in TRAINER_TEST_FILES.items() for name in names}


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Leave out a trainer's test module when the trainer does not import.

    Probed only when that module is about to be collected: importing verl costs seconds, so
    ``pytest tests/integrations/test_trl.py`` does not pay it.
    """
    module = _TRAINER_OF.get(collection_path.name)
    if module is None or collection_path.resolve().parent != _HERE:
        return None
    return True if trainer_import_error(module) is not None else None


@pytest.fixture(scope="session")
def demo_tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(DEMO_MODEL_PATH))


@pytest.fixture
def scripted_engine(demo_tokenizer: Any) -> ScriptedEngine:
    return ScriptedEngine(calculator_script(demo_tokenizer))
