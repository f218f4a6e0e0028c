"""One composition root for every way of running rollouts.

:class:`RunSpec` names a run; :func:`open_run` turns it into an open engine and a runner,
:func:`build_runner` into a runner on an engine the caller holds. The CLI, the Ray worker,
eval, bench and the trainer adapters all go through them; the defaults (rewards, vision,
context length) are the runner's own, so a runner built directly behaves the same.
"""

from toolrollout.engines._factory import connect as connect
from toolrollout.rollout._defaults import default_rewards as default_rewards

from ._open import build_runner as build_runner
from ._open import load_components as load_components
from ._open import open_run as open_run
from ._policy import load_tokenizer as load_tokenizer
from ._spec import RunSpec as RunSpec

__all__ = [
    "RunSpec",
    "build_runner",
    "connect",
    "default_rewards",
    "load_components",
    "load_tokenizer",
    "open_run",
]
