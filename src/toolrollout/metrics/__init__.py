"""One metric naming scheme for rollouts, evaluation, trackers and trainer adapters.

``rollout_metrics(trajectories)`` returns batch metrics named ``section/quantity[/stat]``
(``rollout/num_turns/mean``, ``tools/<name>/failure_rate``, ``timing/tools_s/mean``...);
docs/eval.md lists every name. Pure Python: importing it pulls in nothing heavy.
"""

from ._scheme import rollout_metrics as rollout_metrics

__all__ = [
    "rollout_metrics",
]
