"""The trackers for real: a local MLflow file store and a W&B offline run directory."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from tests.eval._wandb import read_wandb_records

from toolrollout import UserError
from toolrollout.apps.eval import log_to_mlflow, log_to_wandb

METRICS = {
    "eval/accuracy": 0.75,
    "rollout/num_turns/mean": 2.5,
    "tools/calculator/failure_rate": 0.125,
    "baseline/eval/accuracy": 0.25,
    "rollout/reward/std": float("nan"),
}
CONFIG = {"n": 4, "decoding": "sampled", "model": "demo"}


def artifacts(tmp_path: Path) -> list[Path]:
    data = tmp_path / "trajectories.parquet"
    data.write_bytes(b"PAR1 not really")
    report = tmp_path / "report.md"
    report.write_text("# report\n")
    return [data, report]


def test_mlflow_file_store_holds_metrics_params_and_artifacts(tmp_path: Path) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    store = tmp_path / "mlruns"
    run = log_to_mlflow(
        METRICS,
        config=CONFIG,
        artifacts=artifacts(tmp_path),
        tracking_uri=store,
        experiment="exp",
        run_name="demo-eval",
    )
    client = MlflowClient(tracking_uri=store.resolve().as_uri())
    got = client.get_run(run.run_id)
    expected = {k: v for k, v in METRICS.items() if k != "rollout/reward/std"}
    assert got.data.metrics == expected  # NaN is left out, not logged as a number
    assert got.data.params == {k: str(v) for k, v in CONFIG.items()}
    assert got.info.status == "FINISHED"
    assert got.info.run_name == "demo-eval"
    names = sorted(a.path for a in client.list_artifacts(run.run_id))
    assert names == ["report.md", "trajectories.parquet"]
    # a second run lands in the same experiment
    again = log_to_mlflow(
        {"eval/accuracy": 1.0}, config={}, artifacts=[], tracking_uri=store, experiment="exp"
    )
    assert client.get_run(again.run_id).info.experiment_id == got.info.experiment_id


def test_missing_tracker_package_is_a_user_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mlflow", None)
    monkeypatch.setitem(sys.modules, "mlflow.entities", None)
    with pytest.raises(UserError, match="pip install"):
        log_to_mlflow({}, config={}, artifacts=[])
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(UserError, match="pip install"):
        log_to_wandb({}, config={}, artifacts=[])


@pytest.mark.slow
def test_wandb_offline_run_holds_metrics_config_and_artifact(tmp_path: Path) -> None:
    pytest.importorskip("wandb")
    run = log_to_wandb(
        METRICS,
        config=CONFIG,
        artifacts=artifacts(tmp_path),
        directory=tmp_path / "wb",
        project="exp",
        run_name="demo-eval",
    )
    run_dir = Path(run.location)
    assert run_dir.parent == tmp_path / "wb" / "wandb"
    assert run_dir.name.startswith("offline-run-")
    [log] = list(run_dir.glob("run-*.wandb"))
    records = read_wandb_records(log)
    kinds = [r.WhichOneof("record_type") for r in records]

    history = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            history.update(
                {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            )
    for key, value in METRICS.items():
        if key != "rollout/reward/std":
            assert history[key] == pytest.approx(value)
    assert "rollout/reward/std" not in history

    config = {}
    for r in records:
        kind = r.WhichOneof("record_type")
        updates = (
            r.run.config.update if kind == "run" else r.config.update if kind == "config" else []
        )
        config.update({i.key: json.loads(i.value_json) for i in updates})
    assert {k: config[k] for k in CONFIG} == CONFIG

    [artifact] = [r.artifact for r in records if r.WhichOneof("record_type") == "artifact"]
    assert artifact.type == "eval"
    assert sorted(e.path for e in artifact.manifest.contents) == [
        "report.md",
        "trajectories.parquet",
    ]
    [run_record] = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run_record.display_name == "demo-eval" and run_record.project == "exp"
    assert "exit" in kinds
