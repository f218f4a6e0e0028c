"""A child process that SIGKILLs itself at one step of finishing a run (fault tests only).

The library's finishing functions (``finish_shards``, ``clean_finished``) take an
``on_step`` callback, called with each of ``FINISH_STEPS`` as it is reached. The code below
hands them one that kills the process at the chosen step, with no handler and no clean-up,
as ``kill -9`` would; the rest of the child is the ordinary command or function.
"""

from __future__ import annotations

import sys

_PRELUDE = """\
import functools, os, signal, sys
import toolrollout.rollout as rollout
from toolrollout.rollout._shards import FINISH_STEPS
step = sys.argv.pop(1)
assert step in FINISH_STEPS, step
def kill_at(reached):
    if reached == step:
        os.kill(os.getpid(), signal.SIGKILL)
rollout.finish_shards = functools.partial(rollout.finish_shards, on_step=kill_at)
"""


def killed_command(step: str, *args: str) -> list[str]:
    """``toolrollout ARGS...`` (the CLI's own entry point), killed at ``step``."""
    return [
        sys.executable,
        "-c",
        _PRELUDE + "from toolrollout.apps import main; main()",
        step,
        *args,
    ]


def killed_code(step: str, code: str) -> list[str]:
    """Python ``code`` run after ``rollout.finish_shards`` is wired to kill at ``step``."""
    return [sys.executable, "-c", _PRELUDE + code, step]
