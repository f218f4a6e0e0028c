"""Multi-turn rollouts on the real vLLM server, and what a broken server does to them.

The rows' logprobs are checked against a float32 transformers recompute of the same ids
(teacher forcing) at the run's temperature. A reload whose folder vanished after it was
checked answers 500: the server is then never sent another request (vLLM's next one would
crash its engine). A server killed with SIGKILL mid-run fails the rows it held, each with
its cause, and a rerun of those samples on the restarted server completes them.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.real_engines.vllm._server import VLLMServer
from toolrollout.apps.demo import DEMO_MODEL_PATH, load_demo_prompts
from toolrollout.engines import GenerateRequest, RetryPolicy, SamplingParams, VLLMClient
from toolrollout.engines._checkpoint import CheckpointLayout, read_layout
from toolrollout.engines.vllm import LOGPROBS_FLAG
from toolrollout.exceptions import EngineUnavailable, InexactLogprobsError
from toolrollout.rewards import numeric_match
from toolrollout.rollout import RolloutConfig, RolloutRunner, Trajectory
from toolrollout.tools import calculator_tool

pytestmark = [pytest.mark.real_engine, pytest.mark.slow, pytest.mark.timeout(1200)]

TEMPERATURE = 0.7
"""Not 1: vLLM's default logprobs would ignore it, so the parity below proves the mode."""
PARITY = 1e-4


@pytest.fixture(scope="module")
def vllm_server(vllm_untied: VLLMServer) -> VLLMServer:
    """The session's untied server (conftest.py), which may be reloaded."""
    return vllm_untied


def runner_for(client: VLLMClient, tokenizer: Any, **config: Any) -> RolloutRunner:
    settings: dict[str, Any] = {
        "sampling": SamplingParams(max_new_tokens=96, temperature=TEMPERATURE),
        "n": 2,
        "max_turns": 4,
        "seed": 1234,
        **config,
    }
    return RolloutRunner(
        client,
        tokenizer,
        [calculator_tool()],
        config=RolloutConfig(**settings),
        rewards=[numeric_match],
    )


def largest_gap(trajectories: list[Trajectory], temperature: float) -> tuple[float, int]:
    """Largest |engine logprob - float32 log_softmax(logits / T)| over the model tokens,
    and how many tokens were compared."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(DEMO_MODEL_PATH), dtype=torch.float32)
    model.eval()  # type: ignore[no-untyped-call]
    worst, count = 0.0, 0
    with torch.no_grad():
        for t in trajectories:
            prompt, ids = list(t.prompt_ids), list(t.response_ids)
            logits = model(input_ids=torch.tensor([prompt + ids])).logits[0].float()
            scored = torch.log_softmax(logits[len(prompt) - 1 : -1] / temperature, dim=-1)
            policy = scored.gather(1, torch.tensor(ids)[:, None])[:, 0]
            engine = torch.tensor(t.rollout_logprobs, dtype=torch.float32)
            trained = torch.tensor(t.loss_mask, dtype=torch.bool)
            worst = max(worst, float((policy - engine)[trained].abs().max()))
            count += int(trained.sum())
    return worst, count


def test_multi_turn_logprobs_match_float32_teacher_forcing(
    vllm_server: VLLMServer, demo_tokenizer: Any
) -> None:
    async def main() -> list[Trajectory]:
        async with VLLMClient(vllm_server.url) as client:
            return await runner_for(client, demo_tokenizer).run(load_demo_prompts()[:8])

    trajectories = anyio.run(main)
    assert len(trajectories) == 16
    multi = [t for t in trajectories if t.num_turns >= 2 and t.num_tool_calls >= 1]
    assert len(multi) >= 8, [(t.status, t.num_turns, t.error) for t in trajectories]
    assert all(t.metrics["drift_mismatches"] == 0 for t in trajectories)
    worst, count = largest_gap(trajectories, TEMPERATURE)
    # measured 2026-12-06: 4.1e-6 over 585 tokens
    assert count > 200 and worst < PARITY, (worst, count)


def test_a_server_killed_mid_run_fails_its_rows_and_a_rerun_completes_them(
    vllm_server: VLLMServer, demo_tokenizer: Any
) -> None:
    """The restarted server runs vLLM's default --logprobs-mode (raw_logprobs): a run at
    temperature 0.7 is refused with one line naming the flag (or, asked to, runs with every
    row labelled), and the rerun at 1.0 (where raw logprobs are the sampling
    distribution's) completes the failed samples, its logprobs exact."""
    prompts = load_demo_prompts()[8:16]
    exact = {"sampling": SamplingParams(max_new_tokens=96, temperature=1.0)}
    retry = RetryPolicy(max_attempts=2, initial_backoff=0.1, jitter=0.0, budget_s=1.0)

    async def first_run() -> list[Trajectory]:
        first = anyio.Event()

        def seen(row: Trajectory) -> None:
            if row.status != "failed":
                first.set()

        async with VLLMClient(vllm_server.url, retry=retry) as client:
            runner = runner_for(client, demo_tokenizer, concurrency=2, **exact)
            rows: list[Trajectory] = []

            async def run() -> None:
                rows.extend(await runner.run(prompts, on_result=seen))

            async with anyio.create_task_group() as tg:
                tg.start_soon(run)
                with anyio.fail_after(300):  # a server that answers nothing fails here
                    await first.wait()
                await anyio.to_thread.run_sync(vllm_server.kill9)
            return rows

    # The restart below makes a new server on the same port: a fresh fixture server would
    # cost a start-up of its own.
    rows = anyio.run(first_run)
    assert len(rows) == 16
    failed = [t for t in rows if t.status == "failed"]
    kept = {(t.prompt_index, t.sample_index) for t in rows if t.status != "failed"}
    assert failed and kept, [t.status for t in rows]
    for t in failed:
        assert t.error is not None and "EngineUnavailable" in t.error, t.error
        assert vllm_server.url in t.error

    vllm_server.logprobs_mode = "raw_logprobs"
    vllm_server.start()

    async def rerun() -> list[Trajectory]:
        async with VLLMClient(vllm_server.url) as client:
            problem = await client.logprob_mismatch(SamplingParams(temperature=TEMPERATURE))
            assert problem is not None and "\n" not in problem
            assert "raw_logprobs" in problem and LOGPROBS_FLAG in problem
            assert await client.logprob_mismatch(exact["sampling"]) is None
            with pytest.raises(InexactLogprobsError) as refused:
                await runner_for(client, demo_tokenizer).run(prompts, skip=kept)
            assert LOGPROBS_FLAG in str(refused.value) and "\n" not in str(refused.value)
            labelled = await runner_for(
                client, demo_tokenizer, inexact_logprobs="label", max_turns=1
            ).run(prompts[:1])
            assert all(problem == t.metrics["logprob_mismatch"] for t in labelled)
            return await runner_for(client, demo_tokenizer, **exact).run(prompts, skip=kept)

    redone = anyio.run(rerun)
    assert {(t.prompt_index, t.sample_index) for t in redone} == {
        (t.prompt_index, t.sample_index) for t in failed
    }
    assert all(t.status in ("completed", "truncated") for t in redone), [
        (t.status, t.error) for t in redone
    ]
    assert largest_gap(redone, 1.0)[0] < PARITY


def test_a_reload_that_fails_on_the_server_leaves_it_dead_to_the_client(
    vllm_server: VLLMServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The folder passes the check, then disappears (a trainer cleaning up) before vLLM
    reads it: vLLM answers 500 and stays healthy, and its next request would kill it (so
    this runs last: the module's server is not sent anything after it)."""
    vanishing = tmp_path / "step-9"
    shutil.copytree(vllm_server.model, vanishing)
    read: Callable[[str], CheckpointLayout] = read_layout

    def read_then_vanish(folder: str) -> CheckpointLayout:
        layout = read(folder)
        if Path(folder) == vanishing:
            shutil.rmtree(vanishing)
        return layout

    monkeypatch.setattr("toolrollout.engines.vllm._client.read_layout", read_then_vanish)

    async def main() -> None:
        async with VLLMClient(vllm_server.url) as client:
            with pytest.raises(EngineUnavailable, match="failed to reload weights") as failed:
                await client.update_weights_from_disk(vanishing, weight_version="step-9")
            assert "HTTP 500" in str(failed.value) and "restart it" in str(failed.value)
            with pytest.raises(EngineUnavailable, match="failed to reload weights"):
                await client.generate(GenerateRequest([1, 2, 3]))
            with pytest.raises(EngineUnavailable):
                await client.info()

    anyio.run(main)
    # the server itself still says it is healthy: only the client knows
    assert httpx.get(f"{vllm_server.url}/health", timeout=10).status_code == 200
