"""One metric naming scheme for rollouts, evaluation, trackers and trainer adapters.

``rollout_metrics(trajectories)`` returns batch metrics named ``section/quantity[/stat]``
(``rollout/num_turns/mean``, ``tools/<name>/failure_rate``, ``timing/tools_s/mean``...);
docs/eval.md lists every name. Pure Python: importing it pulls in nothing heavy.
"""

from ._scheme import TERMINAL_STATUSES as TERMINAL_STATUSES
from ._scheme import SampleStats as SampleStats
from ._scheme import ToolUse as ToolUse
from ._scheme import metric_key as metric_key
from ._scheme import rollout_metrics as rollout_metrics
from ._scheme import sample_stats as sample_stats

__all__ = [
    "TERMINAL_STATUSES",
    "SampleStats",
    "ToolUse",
    "metric_key",
    "rollout_metrics",
    "sample_stats",
]
