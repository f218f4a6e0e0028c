"""Whether the trainer packages import, and what to do when they do not.

CI installs verl and ms-swift (README's test command: ``requirements/trainer-deps.txt`` with
the test extra, then ``requirements/trainers.txt`` with ``--no-deps``), so their absence is a
failure. ``TOOLROLLOUT_SKIP_TRAINER_TESTS=1`` is the only way to turn it into a skip, for an
environment built with the bare ``.[test]`` extra.
"""

from __future__ import annotations

import functools
import importlib
import os

SKIP_ENV = "TOOLROLLOUT_SKIP_TRAINER_TESTS"

# Import name -> the test modules that import it at module level.
TRAINER_TEST_FILES: dict[str, tuple[str, ...]] = {
    "verl": ("test_verl.py",),
    "swift": ("test_swift.py", "test_swift_weight_sync.py"),
}

INSTALL_HINT = (
    ".venv/bin/pip install -r requirements/trainer-deps.txt && "
    ".venv/bin/pip install --no-deps -r requirements/trainers.txt"
)


@functools.cache
def trainer_import_error(module: str) -> str | None:
    """``None`` when ``module`` and the submodules the adapters use import, else the error."""
    names = {
        "verl": ("verl.experimental.agent_loop.agent_loop", "verl.workers.rollout.llm_server"),
        "swift": ("swift.rollout.multi_turn", "swift.rlhf_trainers.utils"),
    }[module]
    try:
        for name in names:
            importlib.import_module(name)
    except Exception as exc:  # any failure to import is reported, not only ImportError
        return f"{type(exc).__name__}: {exc}"
    return None


def skip_requested() -> bool:
    return os.environ.get(SKIP_ENV, "") not in ("", "0")
