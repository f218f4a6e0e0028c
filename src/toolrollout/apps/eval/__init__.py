"""Evaluation: accuracy and pass@k, the single-turn baseline, comparisons with bootstrap
intervals, plots and a report, and experiment tracking (MLflow, W&B).

``toolrollout eval`` is the command-line face of this package; everything here also works
on trajectories in memory or on any toolrollout parquet/JSONL file. matplotlib, mlflow and
wandb are imported only by the functions that need them.
"""

from ._stats import bootstrap_difference as bootstrap_difference
from ._stats import bootstrap_mean as bootstrap_mean
from ._summary import compare as compare
from ._summary import summarize as summarize
from ._tracking import log_to_mlflow as log_to_mlflow
from ._tracking import log_to_wandb as log_to_wandb

__all__ = [
    "bootstrap_difference",
    "bootstrap_mean",
    "compare",
    "log_to_mlflow",
    "log_to_wandb",
    "summarize",
]
