"""One set of metric names: the docs' table, rollout_metrics, eval, MLflow and the TRL adapter.

docs/eval.md lists every batch metric name; docs/trainers.md names some of them. Each
emitter is run on the same trajectories and the names it emits are compared with the
table, not with each other's code. verl and ms-swift emit no batch metrics of their own
(verl aggregates its per-sample ``AgentLoopMetrics`` itself); their per-sample extras
are ``trajectory_extras``, checked in test_metrics.py.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from itertools import product
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from toolrollout import RolloutConfig, RolloutRunner, SamplingParams
from toolrollout._records import Trajectory
from toolrollout.integrations import trl_rollout_func
from toolrollout.metrics import rollout_metrics
from toolrollout.spec import RunSpec
from toolrollout.testing import ScriptedEngine
from toolrollout.tools import calculator_tool

DOCS = Path(__file__).resolve().parents[2] / "docs"
SECTIONS = ("rollout/", "tools/", "timing/")
PROMPT = [{"role": "user", "content": "Multiply 4 by 341."}]


def _expand(pattern: str, tool: str) -> set[str]:
    """``a/{b,c}/d`` and ``a/b|c`` to concrete names; ``<name>`` becomes ``tool``."""
    pattern = pattern.replace("<name>", tool)
    pieces = re.split(r"\{([^}]*)\}", pattern)
    options = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(pieces)]
    return {"".join(choice) for choice in product(*options)}


def documented_names(tool: str, *, adapters: bool = False) -> set[str]:
    """The batch metric names of docs/eval.md's table (rollout/, tools/, timing/ rows).

    Rows whose meaning starts with "trainer adapters only" are what an adapter adds to
    ``rollout_metrics`` (the weight sync's cost); they are included with ``adapters``.
    """
    names: set[str] = set()
    for line in (DOCS / "eval.md").read_text().splitlines():
        match = re.match(r"^\| `([^`]+)` \| (.*)", line)
        if match and match[1].startswith(SECTIONS):
            if adapters or not match[2].startswith("trainer adapters only"):
                names |= _expand(match[1], tool)
    return names


def _trajectories(demo_tokenizer: Any, engine: ScriptedEngine) -> list[Trajectory]:
    runner = RolloutRunner(
        engine,
        demo_tokenizer,
        [calculator_tool()],
        config=RolloutConfig(sampling=SamplingParams(max_new_tokens=64), n=2),
        rewards=[lambda t: 1.0 if "1364" in t.messages[-1]["content"] else 0.0],
    )
    return runner.run_sync([PROMPT])


def test_rollout_metrics_emits_exactly_the_documented_names(
    scripted_engine: ScriptedEngine, demo_tokenizer: Any
) -> None:
    metrics = rollout_metrics(_trajectories(demo_tokenizer, scripted_engine))
    assert set(metrics) == documented_names("calculator")


def test_trainers_page_names_only_documented_metrics() -> None:
    documented = documented_names("<name>", adapters=True) | documented_names(
        "calculator", adapters=True
    )
    text = (DOCS / "trainers.md").read_text()
    for name in re.findall(r"`((?:rollout|tools|timing)/[^`]*)`", text):
        name = name.replace("<status>", "{completed,truncated,aborted,failed}")
        stem = name.removesuffix("...").rstrip("/")
        if "|" in stem:
            head, _, tail = stem.rpartition("/")
            expanded = {f"{head}/{alt}" for alt in tail.split("|")}
        else:
            expanded = _expand(stem, "<name>")
        for one in expanded:
            if name.endswith("..."):
                assert any(d.startswith(one + "/") for d in documented), name
            else:
                assert one in documented, name


def test_eval_and_mlflow_log_the_same_names(
    scripted_engine: ScriptedEngine, demo_tokenizer: Any, tmp_path: Path
) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from toolrollout.apps.eval import log_to_mlflow, summarize

    trajectories = _trajectories(demo_tokenizer, scripted_engine)
    summary = summarize(trajectories)
    batch = {k for k in summary.metrics if k.startswith(SECTIONS)}
    assert batch == documented_names("calculator")
    assert all(k.startswith(("eval/", *SECTIONS)) for k in summary.metrics)
    run = log_to_mlflow(summary.metrics, config={}, artifacts=[], tracking_uri=tmp_path)
    logged = set(MlflowClient(str(tmp_path)).get_run(run.run_id).data.metrics)
    finite = {k for k, v in summary.metrics.items() if not math.isnan(v)}
    assert logged == finite


def test_trl_adapter_logs_the_documented_names(
    scripted_engine: ScriptedEngine, demo_tokenizer: Any
) -> None:
    trainer = SimpleNamespace(
        args=SimpleNamespace(max_completion_length=None),
        model=SimpleNamespace(training=True),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
    )
    with trl_rollout_func(
        scripted_engine, demo_tokenizer, RunSpec(tools=[calculator_tool()])
    ) as rollout:
        rollout([PROMPT, PROMPT], trainer)
    logged = set(trainer._metrics["train"])
    # No reward function ran, so the reward statistics have no data and are left out.
    reward = {f"rollout/reward/{s}" for s in ("mean", "std", "min", "max")}
    assert logged == documented_names("calculator") - reward


def test_trl_weight_sync_logs_its_documented_name(
    scripted_engine: ScriptedEngine, demo_tokenizer: Any
) -> None:
    """A trainer with a step and a model: the adapter syncs and logs what it cost."""
    torch = pytest.importorskip("torch")
    scripted_engine.load_weights = _accept_weights  # type: ignore[attr-defined]
    trainer = SimpleNamespace(
        args=SimpleNamespace(max_completion_length=None),
        state=SimpleNamespace(global_step=3),
        model=torch.nn.Linear(2, 2),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
    )
    with trl_rollout_func(
        scripted_engine, demo_tokenizer, RunSpec(tools=[calculator_tool()])
    ) as rollout:
        rollout([PROMPT], trainer)
    added = set(trainer._metrics["train"]) - documented_names("calculator")
    assert added == documented_names("calculator", adapters=True) - documented_names("calculator")
    assert added == {"rollout/weight_sync/seconds"}


async def _accept_weights(state_dict: Any, *, weight_version: str) -> None:
    del state_dict, weight_version
