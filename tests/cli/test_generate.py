"""`toolrollout generate` as a user runs it: a subprocess, files on disk, exit codes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests._kill_at import killed_command

from toolrollout.apps.demo import load_demo_prompts

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "120"}


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toolrollout", "generate", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )


def test_default_run_writes_parquet_readable_by_pandas_and_polars(tmp_path: Path) -> None:
    proc = run("--limit", "6", "--n", "2", "--seed", "3", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "trajectories.parquet"
    assert out.is_file()
    assert "mean reward" in proc.stdout and "status completed" in proc.stdout

    import pandas as pd
    import polars as pl

    df = pd.read_parquet(out)
    assert len(df) == 12
    assert set(df["status"]) <= {"completed", "truncated", "aborted", "failed"}
    assert (df.groupby("group_id").size() == 2).all()
    assert (df["num_tool_calls"] >= 1).mean() >= 0.8
    assert df["reward"].mean() >= 0.7
    row = df.iloc[0]
    assert len(row["response_ids"]) == len(row["loss_mask"]) == len(row["rollout_logprobs"])
    messages = json.loads(row["messages"])
    assert messages[-1]["role"] == "assistant"
    assert pl.read_parquet(out).height == 12


def test_jsonl_output_and_custom_dataset(tmp_path: Path) -> None:
    data = tmp_path / "q.jsonl"
    data.write_text(
        json.dumps({"messages": [{"role": "user", "content": "What is 12 * 12?"}], "answer": "144"})
        + "\n"
    )
    proc = run("--dataset", str(data), "--out", str(tmp_path / "o.jsonl"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    [line] = (tmp_path / "o.jsonl").read_text().splitlines()
    row = json.loads(line)
    assert row["prompt_index"] == 0 and row["status"] in {"completed", "truncated"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dataset", "missing.jsonl"], "dataset not found"),
        (["--tool-config", "missing.yaml"], "missing.yaml"),
        (["--tool-parser", "klingon"], "unknown --tool-parser"),
        (["--engine", "vllm"], "--engine vllm needs --engine-url"),
        (["--model", "no/such/dir"], "model folder not found"),
        (["--schedule", "priority,fastest"], "unknown scheduling policy fastest"),
        (["--work-history", "h.json"], "--work-history needs --schedule history"),
    ],
)
def test_user_mistakes_get_one_line_and_exit_2(
    tmp_path: Path, args: list[str], message: str
) -> None:
    proc = run(*args, cwd=tmp_path)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_work_history_carries_each_prompts_lengths_to_the_next_run(tmp_path: Path) -> None:
    history = tmp_path / "lengths.json"
    args = ("--limit", "3", "--n", "2", "--schedule", "history", "--work-history", str(history))
    saved: list[dict[str, list[int]]] = []
    finished: list[list[int]] = []
    for step in (1, 2):
        proc = run(*args, "--out", f"step{step}.jsonl", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        saved.append(json.loads(history.read_text())["turns"])
        lines = (tmp_path / f"step{step}.jsonl").read_text().splitlines()
        rows = [json.loads(line) for line in lines]
        finished.append([r["num_turns"] for r in rows if r["status"] in ("completed", "truncated")])
    first, second = saved
    assert len(first) == 3  # one key per prompt: a hash of its messages
    assert sorted(t for turns in first.values() for t in turns) == sorted(finished[0])
    assert sum(map(len, second.values())) == len(finished[0]) + len(finished[1])
    for key, turns in first.items():
        assert second[key][: len(turns)] == turns  # the second run added to the first's
    history.write_text('{"turns": {"p": ["two"]}}')
    proc = run(*args, cwd=tmp_path)
    assert proc.returncode == 2
    assert f"{history}: key 'turns' must map" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_bad_column_is_a_one_line_error(tmp_path: Path) -> None:
    data = tmp_path / "bad.jsonl"
    data.write_text(json.dumps({"question": "no messages column"}) + "\n")
    proc = run("--dataset", str(data), cwd=tmp_path)
    assert proc.returncode == 2
    assert "missing column 'messages'" in proc.stderr and "Traceback" not in proc.stderr


def test_library_example_runs(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "library_rollout.py"
    proc = subprocess.run(
        [sys.executable, str(example)], capture_output=True, text=True, env=ENV, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 8
    assert sum("reward=1.0" in line for line in lines) >= 6


def test_generate_with_the_mcp_stdio_config(tmp_path: Path) -> None:
    """The calculator served by an MCP server over stdio, from the shipped config alone."""
    config = Path(__file__).resolve().parents[2] / "tool_configs" / "mcp_stdio.yaml"
    proc = run("--limit", "3", "--tool-config", str(config), "--out", "mcp.jsonl", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in (tmp_path / "mcp.jsonl").read_text().splitlines()]
    assert len(rows) == 3
    called = [r for r in rows if r["num_tool_calls"] >= 1]
    assert called, rows
    for row in called:
        metrics = json.loads(row["metrics"])
        assert metrics["tool_stats"]["calculator"]["calls"] >= 1
        tool_messages = [m for m in json.loads(row["messages"]) if m["role"] == "tool"]
        assert tool_messages and not tool_messages[0]["content"].startswith("Error")


def _config_on_free_port(name: str, url_key: str, tmp_path: Path) -> Path:
    """The shipped tool config with its local service moved to a free port (tests run in
    parallel with other servers); everything else, the tool schema included, unchanged."""
    import yaml

    from toolrollout.sandbox._background import free_port

    shipped = Path(__file__).resolve().parents[2] / "tool_configs" / name
    config = yaml.safe_load(shipped.read_text(encoding="utf-8"))
    [entry] = config["tools"]
    url = entry["config"][url_key]
    host, _, rest = url.removeprefix("http://").partition(":")
    entry["config"][url_key] = f"http://{host}:{free_port()}/{rest.partition('/')[2]}"
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def _first_call_arguments(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The arguments of the trajectory's first tool call (stored as JSON text or a dict)."""
    call = next(c for m in messages for c in m.get("tool_calls") or [])["function"]
    arguments = call["arguments"]
    return dict(json.loads(arguments) if isinstance(arguments, str) else arguments)


def _rows(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _final_answer(messages: list[dict[str, object]]) -> str:
    last = messages[-1]
    assert last["role"] == "assistant"
    return str(last.get("content") or "").strip()


@pytest.mark.slow
def test_generate_with_the_sandbox_config(tmp_path: Path) -> None:
    """sandbox.yaml end to end: the command starts the bubblewrap sandbox itself, the
    python prompts are picked for the `python` tool, the model's own programs run there."""
    if shutil.which("bwrap") is None:
        if os.environ.get("CI"):
            pytest.fail("bubblewrap (bwrap) is not installed; CI must install it")
        pytest.skip("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
    config = _config_on_free_port("sandbox.yaml", "sandbox_fusion_url", tmp_path)
    proc = run(
        "--limit",
        "8",
        "--seed",
        "5",
        "--tool-config",
        str(config),
        "--out",
        "py.jsonl",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    rows = _rows(tmp_path / "py.jsonl")
    assert len(rows) == 8
    prompts = {p["messages"][-1]["content"]: p for p in load_demo_prompts("python")}
    called = right = 0
    for row in rows:
        messages = json.loads(str(row["messages"]))
        prompt = prompts[messages[1]["content"]]  # the python prompt set, not the calculator's
        tool_messages = [m for m in messages if m["role"] == "tool"]
        stats = json.loads(str(row["metrics"]))["tool_stats"]
        if not tool_messages or stats["python"]["calls"] < 1:
            continue
        called += 1
        if _first_call_arguments(messages).get("code") == prompt["code"]:
            # The reference program ran in the sandbox and printed the answer.
            assert tool_messages[0]["content"].strip() == prompt["answer"], tool_messages
            right += 1
    transcript = [json.loads(str(r["messages"]))[2:] for r in rows]
    assert called >= 6, transcript  # the model writes programs and the sandbox runs them
    assert right >= 2, transcript
    assert sum(float(str(r["reward"])) for r in rows) >= 2


@pytest.mark.slow
def test_generate_with_the_search_config(tmp_path: Path) -> None:
    """search.yaml end to end: the command starts the BM25 retriever on the demo corpus, the
    search prompts are picked for the `search` tool, answers come from retrieved passages."""
    config = _config_on_free_port("search.yaml", "retrieval_service_url", tmp_path)
    proc = run(
        "--limit",
        "8",
        "--seed",
        "5",
        "--tool-config",
        str(config),
        "--out",
        "s.jsonl",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    rows = _rows(tmp_path / "s.jsonl")
    assert len(rows) == 8
    prompts = {p["messages"][-1]["content"]: p for p in load_demo_prompts("search")}
    called = found = 0
    for row in rows:
        messages = json.loads(str(row["messages"]))
        prompt = prompts[messages[1]["content"]]
        tool_messages = [m for m in messages if m["role"] == "tool"]
        stats = json.loads(str(row["metrics"]))["tool_stats"]
        if not tool_messages or stats["search"]["calls"] < 1:
            continue
        called += 1
        if _first_call_arguments(messages).get("query_list") == prompt["queries"][:1]:
            # The retriever served the entity's own passage first (real BM25 over the corpus).
            head = tool_messages[0]["content"].splitlines()[0]
            assert head == f'Doc 1 (Title: "{prompt["queries"][0]}")', tool_messages[0]
            found += 1
    transcript = [json.loads(str(r["messages"]))[2:] for r in rows]
    # The model searches and the retriever answers; reading the fact out of the passages is
    # beyond the tiny demo model (docs/quickstart.md), so answers are not asserted here.
    assert called >= 6, transcript
    assert found >= 2, transcript


def test_generate_with_the_calculator_config(tmp_path: Path) -> None:
    config = Path(__file__).resolve().parents[2] / "tool_configs" / "calculator.yaml"
    proc = run(
        "--limit",
        "6",
        "--seed",
        "5",
        "--tool-config",
        str(config),
        "--out",
        "c.jsonl",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    rows = _rows(tmp_path / "c.jsonl")
    assert sum(int(str(r["num_tool_calls"])) >= 1 for r in rows) >= 5
    assert sum(float(str(r["reward"])) for r in rows) / len(rows) >= 0.6


def test_gc_freeze_freezes_what_the_run_loaded(tmp_path: Path) -> None:
    """``--gc-freeze`` is the application's opt-in: the summary says how many objects it
    froze (the libraries, model and tokenizer: hundreds of thousands), and rows still come."""
    proc = run("--limit", "2", "--n", "1", "--gc-freeze", "--out", "t.jsonl", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if "objects frozen (--gc-freeze)" in x)
    frozen = int(line.split("│")[-2].strip().replace(",", ""))
    assert frozen > 100_000
    assert len((tmp_path / "t.jsonl").read_text().splitlines()) == 2


def _thresholds(stdout: str) -> str:
    line = next(x for x in stdout.splitlines() if "(--gc-threshold)" in x)
    return line.split("│")[-2].strip()


def test_the_collector_threshold_is_the_runs_only() -> None:
    """``generate`` called in a process that goes on (a notebook, a test) leaves the
    process's own thresholds as they were."""
    import gc

    from toolrollout.apps.cli.generate import _gc_for_the_run

    before = gc.get_threshold()
    with _gc_for_the_run(True, 12_345) as did:
        assert gc.get_threshold() == tuple(did["gc_threshold"]) == (12_345, *before[1:])
        assert did["gc_frozen_objects"] > 0 and gc.get_freeze_count() > 0
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_gc_threshold_sets_the_youngest_generations_threshold(tmp_path: Path) -> None:
    """``--gc-threshold N``: the summary reads the collector's thresholds back after the
    run; only the first one moved (Python's defaults are 700, 10, 10). Without the flag a
    local run collects after 100,000 allocations, and freezes nothing."""
    proc = run("--limit", "1", "--n", "1", "--gc-threshold", "20000", "--out", "t.jsonl",
               cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert _thresholds(proc.stdout) == "20,000, 10, 10"
    assert len((tmp_path / "t.jsonl").read_text().splitlines()) == 1
    plain = run("--limit", "1", "--n", "1", "--out", "u.jsonl", cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    assert _thresholds(plain.stdout) == "100,000, 10, 10"
    assert "objects frozen" not in plain.stdout


def test_the_file_says_how_it_was_sampled_and_a_resume_must_sample_alike(
    tmp_path: Path,
) -> None:
    import pandas as pd
    import pyarrow.parquet as pq

    from toolrollout.apps.demo import DEMO_MODEL_PATH
    from toolrollout.rollout import RUN_METADATA_KEY, read_run_metadata
    from toolrollout.rollout._compat import tokenizer_fingerprint
    from toolrollout.spec import load_tokenizer

    flags = ["--limit", "1", "--n", "2", "--seed", "7", "--temperature", "0.7", "--top-p", "0.9"]
    # Killed after its last shard: the folder keeps every row, unmerged, for --resume.
    killed = subprocess.run(
        killed_command("rows-written", "generate", *flags),
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -9, killed.stderr
    # Resuming with other sampling settings would mix two distributions in one file.
    other = run("--resume", *flags[:-4], "--temperature", "1.0", "--top-p", "0.9", cwd=tmp_path)
    assert other.returncode == 2
    assert "temperature 0.7 (now 1.0)" in other.stderr and len(other.stderr.splitlines()) == 1
    done = run("--resume", *flags, cwd=tmp_path)
    assert done.returncode == 0, done.stderr

    out = tmp_path / "trajectories.parquet"
    assert RUN_METADATA_KEY in (pq.read_schema(out).metadata or {})
    meta = read_run_metadata(out)
    assert meta is not None
    assert meta["sampling"] == {
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": -1,
        "min_p": 0.0,
        "max_new_tokens": 128,
        "max_response_tokens": 1024,
        "seed": 7,
    }
    # The engine's own account of itself (Engine.info()), and the tokenizer rendered with.
    assert meta["engine"]["engine"] == "toolrollout-embedded"
    assert meta["engine"]["dtype"] == "float32" and meta["engine"]["engine_version"]
    tokenizer = meta["tokenizer"]
    assert tokenizer["fingerprint"] == tokenizer_fingerprint(load_tokenizer(DEMO_MODEL_PATH))
    assert tokenizer["family"] == "qwen25"
    # Per row too: rows kept from an interrupted run say how they were sampled.
    rows = pd.read_parquet(out)
    assert len(rows) == 2
    assert all(s["temperature"] == 0.7 and s["seed"] == 7 for s in rows["sampling"])
