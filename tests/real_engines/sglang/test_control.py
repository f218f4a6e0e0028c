"""The control plane the SGLang client relies on, against the real server (sglang 0.5.23):
abort by rid, every pause mode and continue, flush, weight updates from disk with versions.

Each test leaves the session's server as it found it (running, the demo weights, version
``default`` or restored).
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from tests.real_engines.sglang._launch import DEMO_MODEL, LIMIT, SGLangServer
from tests.real_engines.sglang._prompts import chat_ids
from toolrollout.engines import GenerateRequest, GenerateResult, SamplingParams, SGLangClient
from toolrollout.engines._control import PauseMode
from toolrollout.exceptions import EngineRequestRejected

pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(LIMIT)]

LONG = 900  # tokens a long request may decode (the context is 1024)


def long_request(rid: str, max_new_tokens: int = LONG) -> GenerateRequest:
    return GenerateRequest(
        input_ids=chat_ids("Count for me."),
        sampling=SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True),
        rid=rid,
    )


def greedy() -> GenerateRequest:
    return GenerateRequest(
        input_ids=chat_ids("What is 6 * 7?"), sampling=SamplingParams(temperature=0.0)
    )


async def until_running(client: SGLangClient, count: int = 1) -> None:
    """Wait (polling ``/v1/loads``) until ``count`` requests are decoding on the server."""
    with anyio.fail_after(60):
        while True:
            (load,) = (await client.get_loads())["loads"]
            if load["num_running_reqs"] >= count:
                await anyio.sleep(0.3)  # a few decode steps, so there is partial output
                return
            await anyio.sleep(0.05)


@asynccontextmanager
async def in_flight(
    client: SGLangClient, request: GenerateRequest
) -> AsyncIterator[list[GenerateResult]]:
    """``request`` generating in a task while the block runs; its result lands in the list."""
    results: list[GenerateResult] = []

    async def run() -> None:
        results.append(await client.generate(request))

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        await until_running(client)
        yield results


def assert_partial(result: GenerateResult) -> None:
    assert result.finish_reason.type == "abort"
    assert 0 < len(result.output_ids) < LONG  # the partial output is kept...
    assert result.output_logprobs is not None  # ...with a logprob per token
    assert len(result.output_logprobs) == len(result.output_ids)


async def test_abort_by_rid_keeps_the_partial_output(sglang_fp32: SGLangServer) -> None:
    async with SGLangClient(sglang_fp32.url) as client:
        async with in_flight(client, long_request("abort-me")) as results:
            await client.abort("abort-me")
        assert_partial(results[0])
        # the server serves on
        assert (await client.generate(greedy())).finish_reason.type == "stop"


async def test_abort_all_stops_only_this_client_s_requests(sglang_fp32: SGLangServer) -> None:
    async with SGLangClient(sglang_fp32.url) as mine, SGLangClient(sglang_fp32.url) as other:
        theirs: list[GenerateResult] = []

        async def run_other() -> None:
            theirs.append(await other.generate(long_request("theirs", 200)))

        async with anyio.create_task_group() as tg:
            tg.start_soon(run_other)
            async with in_flight(mine, long_request("mine")) as results:
                await until_running(mine, 2)
                await mine.abort_all()
        assert_partial(results[0])
        assert theirs[0].finish_reason.type == "length" and len(theirs[0].output_ids) == 200


async def test_pause_abort_ends_running_requests_then_continue(sglang_fp32: SGLangServer) -> None:
    async with SGLangClient(sglang_fp32.url) as client:
        try:
            async with in_flight(client, long_request("paused-abort")) as results:
                await client.pause_generation("abort")
        finally:
            await client.continue_generation()
        assert_partial(results[0])
        assert (await client.generate(greedy())).finish_reason.type == "stop"


@pytest.mark.parametrize("mode", ["in_place", "retract"])
async def test_pause_keeps_running_requests_until_continue(
    sglang_fp32: SGLangServer, mode: PauseMode
) -> None:
    """``in_place`` and ``retract`` keep the request: after continue it runs to its end."""
    async with SGLangClient(sglang_fp32.url) as client:
        async with in_flight(client, long_request(f"paused-{mode}", 300)) as results:
            await client.pause_generation(mode)
            try:
                await anyio.sleep(0.5)
                assert results == []  # held while paused
            finally:  # never leave the session's server paused
                await client.continue_generation()
        (result,) = results
        assert result.finish_reason.type == "length" and len(result.output_ids) == 300


async def test_flush_cache_is_refused_while_requests_run(sglang_fp32: SGLangServer) -> None:
    async with SGLangClient(sglang_fp32.url) as client:
        assert await client.flush_cache() is True
        async with in_flight(client, long_request("flush-busy", 400)) as results:
            busy = await client.flush_cache()
        assert busy is False
        assert results[0].finish_reason.type == "length"
        assert await client.flush_cache() is True


def perturbed_copy(folder: Path) -> Path:
    """The demo model with every weight nudged, deterministically: other greedy answers."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(DEMO_MODEL, folder)
    weights = load_file(folder / "model.safetensors")
    generator = torch.Generator().manual_seed(0)
    nudged = {
        name: w + 0.05 * torch.randn(w.shape, generator=generator, dtype=w.dtype)
        for name, w in weights.items()
    }
    save_file(nudged, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


async def test_update_weights_from_disk_moves_versions_and_outputs(
    sglang_fp32: SGLangServer, tmp_path: Path
) -> None:
    other = perturbed_copy(tmp_path / "step-1")
    async with SGLangClient(sglang_fp32.url) as client:
        before = await client.generate(greedy())
        version = before.weight_version
        try:
            update = await client.update_weights_from_disk(other, weight_version="step-1")
            assert update.weight_version == "step-1"
            changed = await client.generate(greedy())
            assert (await client.info()).weight_version == "step-1"
            with pytest.raises(EngineRequestRejected):
                await client.update_weights_from_disk(tmp_path / "missing", weight_version="x")
            assert (await client.info()).weight_version == "step-1"  # a refusal changes nothing
        finally:
            await client.update_weights_from_disk(DEMO_MODEL, weight_version=version)
        restored = await client.generate(greedy())
    assert changed.weight_version == "step-1"
    assert changed.output_ids != before.output_ids
    assert restored.weight_version == version
    assert restored.output_ids == before.output_ids


async def test_a_request_paused_across_an_update_reports_both_versions(
    sglang_fp32: SGLangServer,
) -> None:
    """The RL weight-sync pattern: pause in place, load new weights, continue. SGLang
    updates the weights but answers ``success: false`` (its prefix cache could not be
    flushed with the paused request queued); the client sees the new version served and
    goes on. The request's ``meta_info.weight_versions`` says which tokens each version
    sampled, and the result keeps those spans."""
    async with SGLangClient(sglang_fp32.url) as client:
        try:
            async with in_flight(client, long_request("across", 400)) as results:
                await client.pause_generation("in_place")
                try:
                    update = await client.update_weights_from_disk(DEMO_MODEL, weight_version="v2")
                    served = await client.info()  # the scheduler's version, not /model_info's
                finally:
                    await client.continue_generation()
        finally:
            await client.update_weights_from_disk(DEMO_MODEL, weight_version="default")
        assert await client.flush_cache() is True
    (result,) = results
    assert "cache was not flushed" in update.servers[0].message
    assert served.weight_version == "v2"
    assert result.weight_version == "v2"
    (first, second) = result.weight_spans
    assert first[0] == 0 and first[2] == "default" and 0 < first[1] < 400
    assert second == (first[1], 400, "v2")
