"""Straggler control against the real embedded server (the `toolrollout serve` app, demo model).

The server decodes one sequence at a time (``--max-batch-size 1``) and every turn runs to
``max_new_tokens`` (``ignore_eos``), so the order is fixed: one group finishes, the next
request is mid-generation and the others wait in the server's queue when the target is
met. Then ``/abort_request`` must reach the server for each of them (a running request
comes back with its partial ids and SGLang's "Aborted", a queued one with "Abort in
waiting queue"), nothing may be left running there, and the partial trajectory must
resume token for token: its final ids are prompt + partial + continuation, and every
model logprob (both legs) equals a teacher-forced forward pass over exactly those ids.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest
from tests._serve_thread import demo_server_in_thread

from toolrollout.apps.demo import DEMO_MODEL_PATH, load_demo_prompts
from toolrollout.engines import SamplingParams, SGLangClient
from toolrollout.rollout import RolloutConfig, RolloutRunner, TrajectoryStatus, read_rows
from toolrollout.rollout._batch import RolloutBatch
from toolrollout.tools import calculator_tool

TOKENS = 96
"""Every turn's length (ignore_eos): long enough that an abort lands mid-generation."""
SERVER_MESSAGES = {"Aborted", "Abort in waiting queue"}


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """The app of `toolrollout serve` under uvicorn on a loopback port, in a thread (a
    subprocess would spend most of this test's time importing torch again)."""
    with demo_server_in_thread() as url:
        yield url


def load(url: str) -> int:
    """Requests the server holds now, running or waiting (SGLang's /get_load)."""
    [entry] = httpx.get(f"{url}/get_load", timeout=10).json()
    return int(entry["num_reqs"])


@pytest.fixture(scope="module")
def batches(server: str) -> tuple[RolloutBatch, RolloutBatch, list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(DEMO_MODEL_PATH))
    config = RolloutConfig(
        sampling=SamplingParams(max_new_tokens=TOKENS, temperature=1.0, ignore_eos=True),
        n=2,
        max_turns=1,
        seed=7,
    )
    loads: list[int] = []

    async def main() -> tuple[RolloutBatch, RolloutBatch]:
        async with SGLangClient(server) as client:
            await client.wait_healthy(timeout=60)
            runner = RolloutRunner(client, tokenizer, [calculator_tool()], config=config)
            first = await runner.run_batch(load_demo_prompts()[:3], target_groups=1)
            loads.append(load(server))
            second = await runner.resume(first.leftover)
            loads.append(load(server))
            return first, second

    first, second = anyio.run(main)
    return first, second, loads


def test_stops_at_the_target_and_the_aborts_reach_the_server(
    batches: tuple[RolloutBatch, RolloutBatch, list[int]],
) -> None:
    first, _, loads = batches
    assert len(first.trajectories) == 2
    assert len({t.group_id for t in first.trajectories}) == 1  # one whole group
    for t in first.trajectories:
        assert t.status is TrajectoryStatus.TRUNCATED and t.finish_reason == "length"
        assert len(t.response_ids) == TOKENS
    assert loads[0] == 0  # nothing left running or queued on the server
    assert len(first.leftover) == 4
    # The request decoding when the target was met is aborted mid-generation, unless it
    # ended first (seen once on a loaded machine): then it is a finished member of a group
    # not yet complete, and waits in the leftover with its group.
    assert len(first.partial) >= 3
    for t in first.leftover:
        if t.status is not TrajectoryStatus.ABORTED:
            assert t.status is TrajectoryStatus.TRUNCATED and len(t.response_ids) == TOKENS
            continue
        # Each was stopped on the server by its rid, not just dropped by the client.
        assert t.finish_reason == "abort" and t.error in SERVER_MESSAGES, t.error
        assert t.resume_point is not None
    cut = [t for t in first.partial if t.response_ids]
    # Usually the running request has decoded some tokens when its abort lands; under heavy
    # load it may not have, so a cut is checked when there is one (the scripted tests in
    # test_stragglers.py cover a mid-turn cut deterministically).
    assert all(0 < len(t.response_ids) < TOKENS for t in cut)
    assert all(t.error == "Aborted" for t in cut)


def test_partial_trajectories_resume_token_for_token(
    batches: tuple[RolloutBatch, RolloutBatch, list[int]],
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    first, second, loads = batches
    assert loads[1] == 0
    assert second.leftover == ()
    assert len(second.trajectories) == 4  # the two unfinished groups, now whole
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(str(DEMO_MODEL_PATH), dtype=torch.float32)
    model.eval()  # type: ignore[no-untyped-call]
    before = {t.uid: t for t in first.leftover}
    checked = 0
    for t in second.trajectories:
        partial = before[t.uid]
        assert t.status is TrajectoryStatus.TRUNCATED and t.finish_reason == "length"
        assert t.prompt_ids == partial.prompt_ids
        assert len(t.response_ids) == TOKENS  # the cut turn's cap counts both legs
        head = len(partial.response_ids)
        assert t.response_ids[:head] == partial.response_ids
        assert t.rollout_logprobs[:head] == partial.rollout_logprobs
        assert t.loss_mask == [1] * TOKENS and t.num_turns == 1
        if partial.status is TrajectoryStatus.ABORTED:  # else it had finished: kept as is
            assert t.metrics["resumes"] == 1
            assert [s[:2] for s in t.metrics["weight_versions"]][-1] == [head, TOKENS]
        ids = list(t.prompt_ids) + t.response_ids
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float()
        logprobs = torch.log_softmax(logits, dim=-1)
        start = len(t.prompt_ids)
        for i, engine_lp in enumerate(t.rollout_logprobs):
            forced = logprobs[start + i - 1, ids[start + i]].item()
            assert abs(forced - engine_lp) < 1e-4, (t.uid, i, forced, engine_lp)
            checked += 1
    assert checked == 4 * TOKENS


def test_generate_cli_writes_only_the_target_groups(server: str, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from toolrollout.apps.cli import app

    out = tmp_path / "batch.jsonl"
    args = ["generate", "--engine-url", server, "--n", "2", "--max-new-tokens", "24"]
    args += ["--target-groups", "2", "--oversample", "2", "--out", str(out)]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    rows = read_rows(out)
    assert len(rows) == 4  # two whole groups of two, out of four launched
    groups = Counter(r["group_id"] for r in rows)
    assert sorted(groups.values()) == [2, 2]
    assert all(r["status"] != "aborted" for r in rows)
    assert load(server) == 0
    bad = CliRunner().invoke(app, [*args[:-2], "--oversample", "99", "--out", str(out)])
    assert bad.exit_code != 0 and "launches 198 groups" in bad.output
