"""`toolrollout eval` as a user runs it, on the demo model, checked against the files.

Every figure the command reports is recomputed here straight from the trajectory parquet
files (pyarrow, the messages, math.comb), not through toolrollout's own summary code.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from tests.eval._wandb import read_wandb_records
from typer.testing import CliRunner

from toolrollout.apps.cli import app
from toolrollout.apps.demo import load_demo_prompts

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "140"}
# The eval extra (in the test extra) brings mlflow; an environment without it still checks
# the figures, and the MLflow test is skipped there.
TRACKER = "mlflow" if importlib.util.find_spec("mlflow") else "none"


def toolrollout(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toolrollout", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=ENV,
        timeout=400,
    )


def direct(path: Path) -> dict[str, Any]:
    """Accuracy, pass@k, turns, tool use and time, counted from the raw rows."""
    rows = pq.read_table(path).to_pylist()
    correct: dict[int, int] = Counter()
    total: dict[int, int] = Counter()
    per_tool: Counter[str] = Counter()
    by_source: dict[str, list[bool]] = defaultdict(list)
    for row in rows:
        ok = row["reward"] is not None and row["reward"] >= 0.5
        total[row["prompt_index"]] += 1
        correct[row["prompt_index"]] += ok
        by_source[row["data_source"]].append(ok)
        for message in json.loads(row["messages"]):
            if message["role"] == "tool":  # a call that was run and answered
                per_tool[message["name"]] += 1
    n = min(total.values())

    def pass_at(k: int) -> float:
        return sum(
            1 - math.comb(total[p] - correct[p], k) / math.comb(total[p], k) for p in total
        ) / len(total)

    metrics = [json.loads(r["metrics"]) for r in rows]
    calls = sum(r["num_tool_calls"] for r in rows)
    return {
        "eval/accuracy": sum(correct.values()) / len(rows),
        "eval/pass_at_1": pass_at(1),
        f"eval/pass_at_{n}": pass_at(n),
        "rollout/num_turns/mean": sum(r["num_turns"] for r in rows) / len(rows),
        "tools/calls/mean": calls / len(rows),
        "tools/failure_rate": sum(r["tool_errors"] for r in rows) / calls if calls else 0.0,
        "rollout/response_tokens/mean": sum(len(r["response_ids"]) for r in rows) / len(rows),
        "timing/generation_s/sum": sum(m["generation_seconds"] for m in metrics),
        "timing/tools_s/sum": sum(m["tool_seconds"] for m in metrics),
        "per_tool": {name: c / len(rows) for name, c in per_tool.items()},
        "by_source": {s: sum(v) / len(v) for s, v in by_source.items()},
        "problem_scores": {p: correct[p] / total[p] for p in total},
        "turns": Counter(r["num_turns"] for r in rows),
    }


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    tmp = tmp_path_factory.mktemp("eval")
    data = tmp / "heldout.jsonl"
    rows = load_demo_prompts()[:4]
    with data.open("w") as fh:
        for i, row in enumerate(rows):
            fh.write(json.dumps({**row, "data_source": "mul" if i % 2 else "add"}) + "\n")
    proc = toolrollout(
        "eval",
        *("--dataset", str(data), "--n", "2", "--sampled", "--seed", "5"),
        *("--max-new-tokens", "40", "--max-turns", "3"),
        *("--baseline", "single-turn", "--report-to", TRACKER, "--out-dir", "out"),
        cwd=tmp,
    )
    assert proc.returncode == 0, proc.stderr
    return tmp / "out", proc.stdout


@pytest.mark.slow
def test_eval_figures_match_the_trajectories(evaluated: tuple[Path, str]) -> None:
    out, stdout = evaluated
    assert "accuracy tools - single-turn" in stdout
    payload = json.loads((out / "metrics.json").read_text())
    for label, file in (("tools", "trajectories.parquet"), ("single-turn", "single_turn.parquet")):
        expected = direct(out / file)
        got = payload["runs"][label]["metrics"]
        for key in [k for k in expected if "/" in k]:
            assert got[key] == pytest.approx(expected[key], abs=1e-6), (label, key)
        for name, value in expected["per_tool"].items():
            assert got[f"tools/{name}/calls_per_trajectory"] == pytest.approx(value)
        for source, value in expected["by_source"].items():
            assert got[f"by_source/{source}/eval/accuracy"] == pytest.approx(value)
        histogram = payload["runs"][label]["turns_histogram"]
        assert {int(k): v for k, v in histogram.items()} == dict(expected["turns"])
    tools, single = direct(out / "trajectories.parquet"), direct(out / "single_turn.parquet")
    # The demo model is trained to use the calculator: with tools it calls it and answers.
    assert tools["tools/calls/mean"] >= 0.8 and tools["eval/accuracy"] >= 0.5
    assert single["tools/calls/mean"] == 0 and single["rollout/num_turns/mean"] == 1
    diff = sum(
        tools["problem_scores"][p] - single["problem_scores"][p] for p in tools["problem_scores"]
    ) / len(tools["problem_scores"])
    compare = payload["compare"]
    assert compare["compare/accuracy/diff"] == pytest.approx(diff)
    assert compare["compare/accuracy/ci_low"] <= diff <= compare["compare/accuracy/ci_high"]
    assert compare["compare/accuracy/paired"] == 1.0

    report = (out / "report.md").read_text()
    for figure in ("accuracy.png", "turns.png", "tool_calls.png", "latency.png"):
        assert f"]({figure})" in report
        assert (out / figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "## tools: by data source" in report


@pytest.mark.slow
def test_the_same_metrics_are_in_the_local_mlflow_run(evaluated: tuple[Path, str]) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    out, _ = evaluated
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=(out / "mlruns").resolve().as_uri())
    experiment = client.get_experiment_by_name("toolrollout-eval")
    assert experiment is not None
    [run] = client.search_runs([experiment.experiment_id])
    payload = json.loads((out / "metrics.json").read_text())
    expected = {
        **payload["runs"]["tools"]["metrics"],
        **{f"baseline/{k}": v for k, v in payload["runs"]["single-turn"]["metrics"].items()},
        **{k: v for k, v in payload["compare"].items() if k.startswith("compare/")},
    }
    expected = {k: v for k, v in expected.items() if not math.isnan(v)}
    assert run.data.metrics == pytest.approx(expected)
    assert run.data.params["n"] == "2" and run.data.params["decoding"] == "sampled"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"trajectories.parquet", "single_turn.parquet", "report.md", "accuracy.png"} <= artifacts


@pytest.mark.slow
def test_compare_two_files_side_by_side(evaluated: tuple[Path, str], tmp_path: Path) -> None:
    pytest.importorskip("wandb")
    out, _ = evaluated
    proc = toolrollout(
        "eval",
        *("--compare", str(out / "single_turn.parquet"), str(out / "trajectories.parquet")),
        *("--out-dir", str(tmp_path / "cmp"), "--report-to", "wandb", "--run-name", "cmp"),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    payload = json.loads((tmp_path / "cmp" / "metrics.json").read_text())
    # The W&B offline run holds the same comparison.
    [log] = (tmp_path / "cmp" / "wandb").glob("offline-run-*/run-*.wandb")
    summary = {
        "/".join(item.nested_key) or item.key: json.loads(item.value_json)
        for record in read_wandb_records(log)
        if record.WhichOneof("record_type") == "summary"
        for item in record.summary.update
    }
    assert summary["compare/accuracy/diff"] == pytest.approx(
        payload["compare"]["compare/accuracy/diff"]
    )
    assert summary["after/eval/accuracy"] == pytest.approx(
        payload["runs"]["trajectories"]["metrics"]["eval/accuracy"]
    )
    assert set(payload["runs"]) == {"single_turn", "trajectories"}
    before = json.loads((out / "metrics.json").read_text())
    assert payload["compare"]["compare/accuracy/diff"] == pytest.approx(
        before["compare"]["compare/accuracy/diff"]
    )
    assert payload["runs"]["trajectories"]["metrics"] == pytest.approx(
        before["runs"]["tools"]["metrics"], nan_ok=True
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--greedy", "--n", "2"], "use --sampled"),
        (["--compare", "nope.parquet", "nope2.parquet"], "trajectory file not found"),
        (["--report-to", "neptune"], "Invalid value"),
        (["--compare", "a.parquet", "b.parquet", "--baseline", "single-turn"], "no --baseline"),
    ],
)
def test_user_mistakes_exit_2_with_one_line(
    args: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["eval", *args])
    assert result.exit_code == 2
    assert message in result.output


def test_a_dataset_without_answers_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["eval", "--dataset", str(data)])
    assert result.exit_code == 2
    assert (
        result.output.strip()
        == "error: eval needs a ground truth per prompt ('answer' or 'ground_truth')"
    )


@pytest.mark.parametrize("command", ["eval", "generate"])
def test_engine_client_flags_reach_the_run_spec(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`eval` and `generate` build the engine client from the same flags (issue 23's retry
    budget and failover), through one RunSpec."""
    import toolrollout.spec as spec_module
    from toolrollout._exceptions import UserError

    seen: list[Any] = []

    def capture(spec: Any, **_: Any) -> Any:
        seen.append(spec)
        raise UserError("stopped after the run spec was built")

    monkeypatch.setattr(spec_module, "load_components", capture)
    flags = ["--request-timeout", "7", "--retries", "4", "--retry-budget", "9.5"]
    flags += ["--failover-after", "0", "--engine-url", "http://127.0.0.1:9"]
    flags += ["--out-dir" if command == "eval" else "--out", str(tmp_path / "o")]
    result = CliRunner().invoke(app, [command, *flags])
    assert result.exit_code == 2, result.output
    assert "stopped after the run spec was built" in result.output
    [spec] = seen
    assert (spec.request_timeout, spec.retries, spec.retry_budget, spec.failover_after) == (
        7.0,
        4,
        9.5,
        0,
    )
    options = spec.client_options()
    assert options["retry"].max_attempts == 4 and options["retry"].budget_s == 9.5
    assert options["failover_after"] is None  # 0: never move
