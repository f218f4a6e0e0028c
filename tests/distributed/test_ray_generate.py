"""`toolrollout generate --ray` on a real local two-node Ray cluster, one worker per node.

The cluster is Ray's own ``ray.cluster_utils.Cluster`` (a head node and a second node, each
its own raylet process on this machine); the CLI runs as a user runs it, in a subprocess
that joins the cluster by address, against a real ``toolrollout serve`` with the demo model
and the real calculator.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from tests._processes import free_port, stop, wait_http

from toolrollout.rollout import TRAJECTORY_SCHEMA, TrajectoryStatus, read_leftover, read_rows

ROOT = Path(__file__).resolve().parents[2]
ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "COLUMNS": "120",
    "RAY_USAGE_STATS_ENABLED": "0",
}
PROMPTS, N = 8, 2


def _cli(*args: str, cwd: Path, **kwargs: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "toolrollout", "generate", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        **kwargs,
    )


def test_importing_toolrollout_never_imports_ray() -> None:
    code = (
        "import sys, toolrollout, toolrollout.apps.distributed, toolrollout.apps.cli.generate; "
        "print('ray' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_ray_flag_without_ray_says_how_to_install(tmp_path: Path) -> None:
    # A None entry in sys.modules makes `import ray` fail exactly as if it were absent.
    code = (
        "import sys; sys.modules['ray'] = None; "
        "sys.argv = ['toolrollout', 'generate', '--ray', '--limit', '2']; "
        "from toolrollout.apps.cli import main; main()"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=ENV
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: --ray needs Ray: pip install 'toolrollout[ray]'"
    ]
    assert not list(tmp_path.iterdir())  # nothing written before the check


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ray-address", "auto"], "--ray-address needs --ray"),
        (["--ray", "--resume-leftover", "x.parquet"], "--resume-leftover does not work with --ray"),
    ],
)
def test_ray_option_mistakes_are_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    proc = _cli(*args, cwd=tmp_path)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    [line] = err.strip().splitlines()
    assert line.startswith(f"error: {message}")
    assert not list(tmp_path.iterdir())


def test_a_fresh_run_refuses_an_interrupted_ray_runs_folder(tmp_path: Path) -> None:
    """Rows in worker folders belong to the interrupted run: only --resume may use them,
    and its manifest (the run id in every group id) is left as it was."""
    parts = tmp_path / "out.parquet.parts"
    _leave_an_interrupted_run(parts, run_id="seeded2", prompt_index=0)
    manifest = (parts / "run.json").read_text()
    proc = _cli("--limit", "4", "--n", str(N), "--out", "out.parquet", cwd=tmp_path)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert "holds an unfinished run: pass --resume" in err
    assert (parts / "run.json").read_text() == manifest


@pytest.mark.slow
def test_an_unreachable_engine_url_is_one_line_before_ray_starts(tmp_path: Path) -> None:
    _ray_or_skip()
    proc = _cli(
        "--ray", "--engine-url", f"http://127.0.0.1:{free_port()}", "--health-timeout", "2",
        cwd=tmp_path,
    )  # fmt: skip
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    [line] = err.strip().splitlines()
    assert line.startswith("error: SGLang not healthy after 2 s: http://127.0.0.1:")


def _ray_or_skip() -> None:
    try:
        import ray  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("ray is not installed; the test extra must bring it")
        pytest.skip("ray is not installed: pip install 'toolrollout[ray]'")


@dataclass(frozen=True)
class Setup:
    address: str  # of the Ray head
    nodes: list[str]  # ids of the two nodes, one CPU each
    server: str  # a running `toolrollout serve` with the demo model


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    """Two one-CPU Ray nodes (the head and one more), so each holds exactly one rollout
    worker, and one `toolrollout serve`, which loads its model while the cluster starts."""
    _ray_or_skip()
    import ray
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    port = free_port()
    log = (tmp_path_factory.mktemp("serve") / "serve.log").open("wb")
    serve = subprocess.Popen(
        [sys.executable, "-m", "toolrollout", "serve", "--port", str(port), "--threads", "1"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=ENV,
    )
    head = None
    try:
        head = Cluster(
            initialize_head=True,
            connect=True,
            head_node_args={"num_cpus": 1, "include_dashboard": False},
        )
        second = head.add_node(num_cpus=1)
        head.wait_for_nodes()
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/health", 120, serve)
        assert head.head_node is not None
        nodes = [str(node.node_id) for node in (head.head_node, second)]
        yield Setup(head.address, nodes, url)
    finally:
        stop(serve)
        log.close()
        if head is not None:
            ray.shutdown()
            head.shutdown()  # type: ignore[no-untyped-call]


def _check_rows(rows: list[dict[str, Any]], prompts: int) -> None:
    """One row per (prompt, sample), in that order; groups whole; tokens well formed."""
    keys = [(r["prompt_index"], r["sample_index"]) for r in rows]
    assert keys == [(p, s) for p in range(prompts) for s in range(N)]
    groups = Counter(r["group_id"] for r in rows)
    assert len(groups) == prompts and set(groups.values()) == {N}
    for row in rows:
        assert row["uid"] == f"{row['group_id']}-{row['sample_index']}"
        if row["failed"]:
            continue
        assert len(row["response_ids"]) == len(row["loss_mask"]) == len(row["rollout_logprobs"])
        assert set(row["loss_mask"]) <= {0, 1} and 1 in row["loss_mask"]
        assert row["prompt_ids"] and row["messages"][-1]["role"] == "assistant"


@pytest.mark.slow
def test_two_worker_nodes_share_one_server(setup: Setup, tmp_path: Path) -> None:
    """No --engine-url: the driver starts the one shared `toolrollout serve` itself."""
    out = tmp_path / "ray.parquet"
    proc = _cli(
        "--ray",
        "--ray-workers",
        "2",
        "--ray-address",
        setup.address,
        "--tool-config",
        str(ROOT / "tool_configs" / "calculator.yaml"),
        "--limit",
        str(PROMPTS),
        "--n",
        str(N),
        "--seed",
        "3",
        "--out",
        str(out),
        cwd=tmp_path,
    )
    stdout, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 0, stderr
    assert "warning" not in stderr
    assert not out.with_name(out.name + ".parts").exists()  # merged, shard folder gone

    # The merged file is exactly the documented schema, readable without toolrollout.
    assert pq.read_schema(out).remove_metadata().equals(TRAJECTORY_SCHEMA)
    rows = read_rows(out)
    _check_rows(rows, PROMPTS)
    assert not any(r["failed"] for r in rows)
    # Prompt i was rolled out by shard i % 2, and the two shards ran on the two nodes.
    for row in rows:
        assert row["metrics"]["ray_shard"] == row["prompt_index"] % 2
    nodes = {r["metrics"]["ray_shard"]: r["metrics"]["ray_node"] for r in rows}
    assert sorted(nodes.values()) == sorted(setup.nodes)
    # Rows of one group share their node; the real calculator was called by the model.
    for p in range(PROMPTS):
        assert len({r["metrics"]["ray_node"] for r in rows if r["prompt_index"] == p}) == 1
    assert sum(r["num_tool_calls"] >= 1 for r in rows) >= PROMPTS
    assert sum(r["reward"] or 0.0 for r in rows) / len(rows) >= 0.5
    assert "ray shard 0" in stdout and "ray shard 1" in stdout


@pytest.mark.slow
def test_a_killed_worker_is_reported_and_its_samples_kept(setup: Setup, tmp_path: Path) -> None:
    """Shard 0's actor is killed mid-run: its written rows are kept, the rest are failed
    rows naming the shard, shard 1 completes, and every sample still has one row.

    The run is a --resume of an interrupted one whose worker 1 had already written prompt
    1's group to its own shard folder: those rows are taken over, not run again."""
    import ray

    out = tmp_path / "killed.jsonl"
    parts = out.with_name(out.name + ".parts")
    _leave_an_interrupted_run(parts, run_id="seeded1", prompt_index=1)
    proc = _cli(
        "--ray",
        "--ray-address",
        setup.address,
        "--engine-url",
        setup.server,
        "--limit",
        "4",
        "--n",
        str(N),
        "--seed",
        "3",
        "--concurrency",
        "1",  # shard 0's samples one after another: the kill lands between two of them
        "--flush-every",
        "1",
        "--resume",
        "--out",
        str(out),
        cwd=tmp_path,
    )
    try:
        # The actor handle is taken while shard 0 starts and the folder is polled often, so
        # the kill lands right after its first row (a 0.2 s poll plus the lookup let a fast
        # shard finish all its samples first).
        name = "toolrollout-seeded1-shard-0"
        deadline = time.monotonic() + 180
        actor = None
        while not list((parts / "worker-000").glob("part-*.parquet")):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "shard 0 wrote no row in time"
            if actor is None:
                with contextlib.suppress(ValueError):  # the actor is not started yet
                    actor = ray.get_actor(name, namespace="toolrollout")
            time.sleep(0.01)
        ray.kill(actor if actor is not None else ray.get_actor(name, namespace="toolrollout"))
        stdout, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    [warning] = [line for line in stderr.splitlines() if line.startswith("warning:")]
    assert warning.startswith("warning: ray shard 0 (prompts 0,2) failed:")
    rows = read_rows(out)
    _check_rows(rows, 4)
    mine = [r for r in rows if r["prompt_index"] % 2 == 0]
    kept = [r for r in mine if not r["failed"]]
    lost = [r for r in mine if r["failed"]]
    assert kept and lost  # written before the kill, and cut short by it
    assert all(r["metrics"]["ray_shard"] == 0 for r in kept)
    for row in lost:
        assert row["status"] == "failed"
        assert row["error"].startswith("DistributedError: ray shard 0")
    resumed = [r for r in rows if r["prompt_index"] == 1]
    assert [r["error"] for r in resumed] == ["left by the interrupted run"] * N
    assert "rows kept from before" in stdout
    others = [r for r in rows if r["prompt_index"] == 3]
    assert not any(r["failed"] for r in others)
    assert all(r["metrics"]["ray_shard"] == 1 for r in others)
    # Same seeds, same tokens: a one-machine run of that group on the same server agrees.
    reference = _one_machine_group(setup.server, prompt_index=3, group_id="seeded1-p3")
    assert [r["response_ids"] for r in others] == [list(t.response_ids) for t in reference]
    assert [r["loss_mask"] for r in others] == [list(t.loss_mask) for t in reference]


@pytest.mark.slow
def test_a_batch_target_counts_groups_over_both_shards(setup: Setup, tmp_path: Path) -> None:
    """--target-groups with --ray: the first group complete on either shard ends the batch
    on both (the other shard's requests are aborted on the server), every shard's leftover
    is merged into one leftover file, and a later run resumes it from the saved tokens."""
    import httpx

    out = tmp_path / "batch.jsonl"
    run = ["--engine-url", setup.server, "--n", str(N), "--seed", "3"]
    # One engine request at a time per shard: when the first group completes on either
    # shard, the other still has trajectories in flight or waiting (its 12 trajectories
    # need about 24 requests in turn), so the stop has something there to abort. With no
    # cap, on a quiet machine the other shard could finish everything before the stop.
    proc = _cli(
        "--ray", "--ray-address", setup.address, *run, "--concurrency", "1",
        "--target-groups", "1", "--oversample", "12", "--out", str(out),
        cwd=tmp_path,
    )  # fmt: skip
    _, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 0, stderr
    rows = read_rows(out)
    assert len(rows) == N and len({r["group_id"] for r in rows}) == 1
    assert all(r["status"] != "aborted" for r in rows)
    [batch_shard] = {r["metrics"]["ray_shard"] for r in rows}
    leftover, info = read_leftover(tmp_path / "batch.leftover.parquet")
    assert info["n"] == N
    keys = {(r["prompt_index"], r["sample_index"]) for r in rows}
    keys |= {(t.prompt_index, t.sample_index) for t in leftover}
    assert keys == {(p, s) for p in range(12) for s in range(N)}  # 12 launched, none twice
    assert len(leftover) == 11 * N
    assert {t.metrics["ray_shard"] for t in leftover} == {0, 1}  # both shards, merged
    aborted = [t for t in leftover if t.status is TrajectoryStatus.ABORTED]
    assert all(t.resume_point is not None for t in aborted)
    # The stop reached the shard that did not meet the target, and its aborts the server.
    assert any(t.metrics["ray_shard"] != batch_shard for t in aborted)
    [load] = httpx.get(f"{setup.server}/get_load", timeout=10).json()
    assert load["num_reqs"] == 0

    rest = tmp_path / "rest.jsonl"
    proc = _cli(
        *run[:2], "--resume-leftover", str(tmp_path / "batch.leftover.parquet"),
        "--out", str(rest), cwd=tmp_path,
    )  # fmt: skip
    _, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 0, stderr
    resumed = {r["uid"]: r for r in read_rows(rest)}
    assert sorted(resumed) == sorted(t.uid for t in leftover)
    for t in aborted:
        head = len(t.response_ids)
        assert resumed[t.uid]["status"] != "aborted"
        assert resumed[t.uid]["response_ids"][:head] == t.response_ids
        assert resumed[t.uid]["loss_mask"][:head] == t.loss_mask


def _one_machine_group(server: str, *, prompt_index: int, group_id: str) -> list[Any]:
    """One group rolled out in this process with the settings `generate` used above
    (its defaults, --n 2 --seed 3 --concurrency 1, the calculator, the first 4 prompts)."""
    import anyio
    from transformers import AutoTokenizer

    from toolrollout.apps.demo import DEMO_MODEL_PATH, DEMO_PROMPTS_PATH
    from toolrollout.data import load_prompts
    from toolrollout.engines import SamplingParams, SGLangClient
    from toolrollout.rewards import numeric_match
    from toolrollout.rollout import RolloutConfig, RolloutRunner
    from toolrollout.tools import calculator_tool

    prompts = load_prompts(DEMO_PROMPTS_PATH, limit=4)
    config = RolloutConfig(
        sampling=SamplingParams(max_new_tokens=128, temperature=1.0, top_p=1.0),
        n=N,
        max_turns=4,
        max_response_tokens=1024,
        concurrency=1,
        seed=3,
    )
    skip = {(p, s) for p in range(len(prompts)) if p != prompt_index for s in range(N)}
    ids = [f"seeded1-p{i}" for i in range(len(prompts))]
    assert ids[prompt_index] == group_id

    async def main() -> list[Any]:
        async with SGLangClient([server]) as engine:
            info = await engine.server_info()
            runner = RolloutRunner(
                engine,
                AutoTokenizer.from_pretrained(str(DEMO_MODEL_PATH)),
                [calculator_tool()],
                config=config,
                rewards=[numeric_match],
                context_length=info.get("context_length"),
            )
            return await runner.run(prompts, group_ids=ids, skip=skip)

    return anyio.run(main)


def _leave_an_interrupted_run(parts: Path, *, run_id: str, prompt_index: int) -> None:
    """The shard folder a killed `generate --ray --limit 4 --n 2` driver leaves behind:
    its manifest, and worker 1's own shard holding one whole group."""
    from toolrollout.apps.demo import DEMO_PROMPTS_PATH
    from toolrollout.rollout import RolloutPrompt, ShardWriter
    from toolrollout.rollout._batch import failed_trajectory

    parts.mkdir()
    dataset = str(DEMO_PROMPTS_PATH.resolve())
    manifest = {"run_id": run_id, "dataset": dataset, "num_prompts": 4, "n": N}
    (parts / "run.json").write_text(json.dumps(manifest))
    with ShardWriter(parts / "worker-001") as writer:
        for sample_index in range(N):
            writer.write(
                failed_trajectory(
                    group_id=f"{run_id}-p{prompt_index}",
                    prompt_index=prompt_index,
                    sample_index=sample_index,
                    prompt=RolloutPrompt(({"role": "user", "content": "left behind"},)),
                    reason="error",
                    error="left by the interrupted run",
                )
            )
