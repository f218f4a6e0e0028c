"""Evaluation: accuracy and pass@k, the single-turn baseline, comparisons with bootstrap
intervals, plots and a report, and experiment tracking (MLflow, W&B).

``toolrollout eval`` is the command-line face of this package; everything here also works
on trajectories in memory or on any toolrollout parquet/JSONL file. matplotlib, mlflow and
wandb are imported only by the functions that need them.
"""

from ._baseline import single_turn_config as single_turn_config
from ._baseline import single_turn_runner as single_turn_runner
from ._report import FIGURES as FIGURES
from ._report import write_report as write_report
from ._stats import Interval as Interval
from ._stats import bootstrap_difference as bootstrap_difference
from ._stats import bootstrap_mean as bootstrap_mean
from ._stats import pass_at_k as pass_at_k
from ._summary import Comparison as Comparison
from ._summary import EvalSummary as EvalSummary
from ._summary import compare as compare
from ._summary import default_ks as default_ks
from ._summary import summarize as summarize
from ._tracking import TrackedRun as TrackedRun
from ._tracking import log_to_mlflow as log_to_mlflow
from ._tracking import log_to_wandb as log_to_wandb

__all__ = [
    "FIGURES",
    "Comparison",
    "EvalSummary",
    "Interval",
    "TrackedRun",
    "bootstrap_difference",
    "bootstrap_mean",
    "compare",
    "default_ks",
    "log_to_mlflow",
    "log_to_wandb",
    "pass_at_k",
    "single_turn_config",
    "single_turn_runner",
    "summarize",
    "write_report",
]
