"""Experiment tracking: MLflow and Weights & Biases, both usable with no network.

Both are optional (the ``eval`` extra), imported only when asked for, and touch no
process-wide state of a trainer in the same process (docs/eval.md, "Tracking").
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from toolrollout._exceptions import TrackingError, UserError

__all__ = ["TrackedRun", "log_to_mlflow", "log_to_wandb"]


def _finite(metrics: Mapping[str, float]) -> dict[str, float]:
    # Trackers reject or mangle NaN; an absent metric is clearer than a fake number.
    return {k: float(v) for k, v in metrics.items() if not math.isnan(float(v))}


@dataclass(frozen=True, slots=True)
class TrackedRun:
    """Where a tracked run landed: its backend, id and location."""

    backend: str
    run_id: str
    location: str


def _mlflow_uri(uri: str | Path) -> str:
    text = str(uri)
    if "://" in text or text.startswith("file:"):
        return text
    return Path(text).resolve().as_uri()


def log_to_mlflow(
    metrics: Mapping[str, float],
    *,
    config: Mapping[str, Any],
    artifacts: list[Path],
    tracking_uri: str | Path = "mlruns",
    experiment: str = "toolrollout-eval",
    run_name: str | None = None,
) -> TrackedRun:
    """Log one run: ``metrics`` (step 0), ``config`` as params, ``artifacts`` as files
    (trajectory files, the report and its figures).

    ``tracking_uri`` is a directory (a local file store), or any URI MLflow accepts
    (``sqlite:///mlflow.db``, ``http://host:5000``). MLflow 3 refuses new file stores unless
    ``MLFLOW_ALLOW_FILE_STORE`` is set; asking for a directory here is that opt-in.
    """
    try:
        from mlflow.entities import Metric, Param, RunStatus
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient
    except ImportError as exc:
        raise UserError(
            "--report-to mlflow needs MLflow: pip install 'toolrollout[eval]' (or mlflow)"
        ) from exc
    uri = _mlflow_uri(tracking_uri)
    if uri.startswith("file:"):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    try:
        client = MlflowClient(tracking_uri=uri)
        found = client.get_experiment_by_name(experiment)
        experiment_id = (
            found.experiment_id if found is not None else client.create_experiment(experiment)
        )
        run = client.create_run(experiment_id, run_name=run_name, tags={"tool": "toolrollout"})
        run_id = run.info.run_id
        status = RunStatus.to_string(RunStatus.FAILED)
        try:
            now = int(time.time() * 1000)
            items = sorted(_finite(metrics).items())
            params = sorted((str(k), str(v)[:500]) for k, v in config.items())
            # log_batch caps a call at 1000 metrics and 100 params.
            for start in range(0, max(len(items), 1), 1000):
                client.log_batch(
                    run_id,
                    metrics=[Metric(k, v, now, 0) for k, v in items[start : start + 1000]],
                )
            for start in range(0, len(params), 100):
                client.log_batch(
                    run_id, params=[Param(k, v) for k, v in params[start : start + 100]]
                )
            for path in artifacts:
                if path.is_dir():
                    client.log_artifacts(run_id, str(path), artifact_path=path.name)
                else:
                    client.log_artifact(run_id, str(path))
            status = RunStatus.to_string(RunStatus.FINISHED)
        finally:
            client.set_terminated(run_id, status=status)
    except MlflowException as exc:
        raise TrackingError(f"MLflow at {uri}: {exc.message}") from exc
    return TrackedRun("mlflow", run_id, uri)


def log_to_wandb(
    metrics: Mapping[str, float],
    *,
    config: Mapping[str, Any],
    artifacts: list[Path],
    directory: str | Path = ".",
    project: str = "toolrollout-eval",
    run_name: str | None = None,
    mode: Literal["online", "offline", "disabled"] = "offline",
) -> TrackedRun:
    """Log one run to W&B: ``metrics`` into the summary (and one history step), ``config``
    as the run config, ``artifacts`` as one ``eval`` artifact. ``mode="offline"`` writes
    ``<directory>/wandb/offline-run-*`` and needs no account or network."""
    try:
        import wandb
    except ImportError as exc:
        raise UserError(
            "--report-to wandb needs wandb: pip install 'toolrollout[eval]' (or wandb)"
        ) from exc
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    # A trainer may have its own run open in this process: leave it alone.
    others_active = wandb.run is not None
    try:
        run = wandb.init(
            reinit="create_new",
            project=project,
            name=run_name,
            dir=str(root),
            mode=mode,
            config=dict(config),
            job_type="eval",
            settings=wandb.Settings(console="off", silent=True),
        )
    except Exception as exc:  # wandb raises its own errors and plain ones alike
        raise TrackingError(f"W&B init failed: {exc}") from exc
    exit_code = 1
    try:
        values = _finite(metrics)
        run.log(values, step=0)
        run.summary.update(values)
        if artifacts:
            artifact = wandb.Artifact(f"eval-{run.id}", type="eval")
            for path in artifacts:
                if path.is_dir():
                    artifact.add_dir(str(path), name=path.name)
                else:
                    artifact.add_file(str(path))
            run.log_artifact(artifact)
        exit_code = 0
    except Exception as exc:
        raise TrackingError(f"W&B logging failed: {exc}") from exc
    finally:
        run.finish(exit_code=exit_code)
        if not others_active:
            # finish() can return before the offline transaction log is flushed; shutting
            # the W&B service down waits for it. Skipped when another run still needs it.
            wandb.teardown()
    return TrackedRun("wandb", run.id, str(Path(run.dir).parent))
