"""Weight sync between trainer steps, over HTTP against a real `toolrollout serve` process.

SGLangClient's pause/continue/update_weights_from_disk/flush_cache calls go to the embedded
server as they would to SGLang; the weights it reloads are a copy of the demo model whose
tensors are shifted by a fixed pattern, so the logprobs of a greedy answer must move, and
moving back to the original folder must restore them exactly.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from tests._processes import free_port, stop, wait_http
from tests._waiting import wait_until

from toolrollout._exceptions import EngineRequestRejected, UserError
from toolrollout.apps.demo import DEMO_MODEL_PATH, load_demo_prompts
from toolrollout.engines import GenerateRequest, GenerateResult, SamplingParams, SGLangClient
from toolrollout.rollout import RolloutConfig, RolloutRunner
from toolrollout.tools import calculator_tool

PROMPT = (5, 6, 7, 8, 9, 10, 11, 12)


@pytest.fixture(scope="module")
def perturbed_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo model folder with every float tensor shifted by ``0.05 * sin(index)``."""
    import torch
    from safetensors.torch import load_file, save_file

    folder = tmp_path_factory.mktemp("perturbed") / "model"
    shutil.copytree(DEMO_MODEL_PATH, folder)
    weights = folder / "model.safetensors"
    tensors = load_file(weights)
    for name, tensor in tensors.items():
        if tensor.is_floating_point():
            pattern = torch.sin(torch.arange(tensor.numel(), dtype=torch.float32))
            tensors[name] = tensor + 0.05 * pattern.reshape(tensor.shape).to(tensor.dtype)
    save_file(tensors, weights, metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = (tmp_path_factory.mktemp("serve") / "serve.log").open("wb")
    argv = [sys.executable, "-m", "toolrollout", "serve", "--port", str(port), "--threads", "1"]
    # the perturbed model and the missing folders all live under the session's temp root
    argv += ["--weights-dir", str(tmp_path_factory.getbasetemp())]
    proc = subprocess.Popen(
        [*argv, "--log-level", "warning"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/health", 120, proc)
        yield url
    finally:
        stop(proc)


def greedy(max_new_tokens: int, *, ignore_eos: bool = False) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=ignore_eos)


async def versions(client: SGLangClient) -> dict[str, str | None]:
    """Each server's weight version, as ``info()`` reports it."""
    return {s.url: s.weight_version for s in (await client.info()).servers}


async def running_requests(url: str) -> int:
    async with httpx.AsyncClient() as http:
        return int((await http.get(f"{url}/get_load")).json()[0]["num_reqs"])


async def generated_tokens(url: str) -> int:
    async with httpx.AsyncClient() as http:
        return int((await http.get(f"{url}/get_load")).json()[0]["num_tokens"])


class SentWatcher(httpx.AsyncBaseTransport):
    """An HTTP transport that sets :attr:`sent` once a /generate body is fully written
    (httpcore's trace event), so a test knows the server has the request."""

    def __init__(self) -> None:
        self.sent = anyio.Event()
        self._inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/generate":

            async def trace(name: str, info: dict[str, Any]) -> None:
                if name == "http11.send_request_body.complete":
                    self.sent.set()

            request.extensions = {**request.extensions, "trace": trace}
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


async def wait_running(url: str) -> None:
    with anyio.fail_after(20):
        while await running_requests(url) == 0:  # noqa: ASYNC110 (polls the server)
            await anyio.sleep(0.02)


def test_paused_server_holds_new_requests_until_continue(server: str) -> None:
    async def main() -> None:
        watcher = SentWatcher()
        async with SGLangClient(server, transport=watcher) as client:
            await client.pause_generation(mode="in_place")
            results: list[GenerateResult] = []
            answered = anyio.Event()

            async def call() -> None:
                request = GenerateRequest(input_ids=PROMPT, sampling=greedy(4))
                results.append(await client.generate(request))
                answered.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                await watcher.sent.wait()  # the server has the request
                with anyio.move_on_after(1.0):  # ample time for 4 tokens on a running server
                    await answered.wait()
                assert results == []  # still waiting on the paused server
                assert await running_requests(server) == 0  # not even queued
                # The server stays responsive to control calls while paused.
                assert await versions(client) == {server: "default"}
                await client.continue_generation()
            assert results[0].finish_reason.type == "length"
            assert len(results[0].output_ids) == 4

    anyio.run(main)


def test_pause_in_place_freezes_a_running_request(server: str) -> None:
    async def main() -> None:
        async with SGLangClient(server) as client:
            result: list[GenerateResult] = []

            async def call() -> None:
                request = GenerateRequest(input_ids=PROMPT, sampling=greedy(400, ignore_eos=True))
                result.append(await client.generate(request))

            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                await wait_running(server)
                await client.pause_generation(mode="in_place")
                # The pause reaches the scheduler between two steps, so a step may still land
                # after it returns: wait for the count to stand, then it must stay put.
                readings = [-1]

                async def standing() -> bool:
                    readings.append(await generated_tokens(server))
                    return readings[-1] == readings[-2]

                await wait_until(standing, interval=0.05, what="the paused request frozen")
                frozen_at = readings[-1]
                await anyio.sleep(0.5)  # a window for a wrong token to appear
                assert await generated_tokens(server) == frozen_at, "generated while paused"
                assert result == [] and await running_requests(server) == 1
                await client.continue_generation(torch_empty_cache=True)
            assert result[0].finish_reason.type == "length"
            assert len(result[0].output_ids) == 400  # resumed, not restarted or cut

    anyio.run(main)


def test_pause_abort_returns_the_partial_output(server: str) -> None:
    async def main() -> None:
        async with SGLangClient(server) as client:
            result: list[GenerateResult] = []

            async def call() -> None:
                request = GenerateRequest(input_ids=PROMPT, sampling=greedy(900, ignore_eos=True))
                result.append(await client.generate(request))

            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                await wait_running(server)
                await client.pause_generation()  # mode abort (SGLang's default)
            assert result[0].finish_reason.type == "abort"
            assert 0 < len(result[0].output_ids) < 900
            assert result[0].output_logprobs is not None
            assert len(result[0].output_logprobs) == len(result[0].output_ids)
            await client.continue_generation()
            after = await client.generate(GenerateRequest(input_ids=PROMPT, sampling=greedy(3)))
            assert len(after.output_ids) == 3

    anyio.run(main)


def test_flush_cache_refuses_while_busy(server: str) -> None:
    async def main() -> None:
        async with SGLangClient(server) as client:
            assert await client.flush_cache()  # idle: accepted
            async with anyio.create_task_group() as tg:
                request = GenerateRequest(
                    rid="busy", input_ids=PROMPT, sampling=greedy(900, ignore_eos=True)
                )
                tg.start_soon(client.generate, request)
                await wait_running(server)
                assert not await client.flush_cache()  # HTTP 400: refused while busy
                await client.abort("busy")

    anyio.run(main)


def test_update_weights_from_disk_changes_logprobs_and_version(
    server: str, perturbed_model: Path
) -> None:
    prompt = load_demo_prompts()[:1]

    async def main() -> None:
        async with SGLangClient(server) as client:

            async def sample() -> GenerateResult:
                return await client.generate(GenerateRequest(input_ids=PROMPT, sampling=greedy(8)))

            before = await sample()
            assert before.weight_version == "default"
            update = await client.update_weights_from_disk(
                str(perturbed_model), weight_version="step-1"
            )
            assert [a.url for a in update.servers] == [server]  # every answer was a success
            assert update.servers[0].num_paused_requests == 0
            assert update.weight_version == "step-1"
            after = await sample()
            assert after.weight_version == "step-1"
            assert await versions(client) == {server: "step-1"}
            info = await client.model_info()
            assert info["weight_version"] == "step-1"
            assert info["model_path"] == str(perturbed_model)
            engine_info = await client.info()
            assert engine_info.weight_version == "step-1"
            assert engine_info.model_path == str(perturbed_model)
            assert before.output_logprobs is not None and after.output_logprobs is not None
            shift = max(
                abs(a - b)
                for a, b in zip(before.output_logprobs, after.output_logprobs, strict=False)
            )
            assert shift > 1e-3, "the perturbed weights did not change the logprobs"

            # A rollout after the update records the new version on its trajectory.
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(DEMO_MODEL_PATH))
            config = RolloutConfig(sampling=greedy(24), n=1, max_turns=1)
            runner = RolloutRunner(client, tokenizer, [calculator_tool()], config=config)
            trajectories = await runner.run(prompt)
            assert [t.weight_version for t in trajectories] == ["step-1"]

            # Back to the original folder: the original logprobs come back exactly.
            await client.update_weights_from_disk(str(DEMO_MODEL_PATH), weight_version="step-2")
            again = await sample()
            assert again.weight_version == "step-2"
            assert again.output_ids == before.output_ids
            assert again.output_logprobs is not None
            assert all(
                math.isclose(a, b, abs_tol=1e-5)
                for a, b in zip(again.output_logprobs, before.output_logprobs, strict=True)
            )

    anyio.run(main)


def test_update_weights_from_a_bad_path_is_a_clear_error(server: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with SGLangClient(server) as client:
            version = (await versions(client))[server]
            missing = tmp_path / "no-such-model"
            with pytest.raises(EngineRequestRejected, match="no-such-model") as info:
                await client.update_weights_from_disk(str(missing), weight_version="bad")
            assert info.value.status_code == 400
            async with httpx.AsyncClient() as http:
                raw = await http.post(
                    f"{server}/update_weights_from_disk", json={"model_path": str(missing)}
                )
            assert raw.status_code == 400
            assert raw.json()["success"] is False
            assert await versions(client) == {server: version}
            result = await client.generate(GenerateRequest(input_ids=PROMPT, sampling=greedy(2)))
            assert result.weight_version == version

    anyio.run(main)


def test_update_weights_refuses_a_folder_outside_weights_dir(server: str) -> None:
    async def main() -> None:
        async with SGLangClient(server) as client:
            version = (await versions(client))[server]
            with pytest.raises(EngineRequestRejected, match="outside the folders") as info:
                await client.update_weights_from_disk("/usr", weight_version="evil")
            assert info.value.status_code == 400
            assert await versions(client) == {server: version}

    anyio.run(main)


def test_update_weights_with_a_nul_byte_is_the_documented_400(server: str) -> None:
    async def main() -> None:
        async with SGLangClient(server) as client:
            version = (await versions(client))[server]
            async with httpx.AsyncClient() as http:
                raw = await http.post(
                    f"{server}/update_weights_from_disk",
                    json={"model_path": f"{DEMO_MODEL_PATH}\x00/evil", "weight_version": "nul"},
                )
            assert raw.status_code == 400, raw.text
            assert raw.json()["success"] is False and "not a usable path" in raw.json()["message"]
            assert await versions(client) == {server: version}

    anyio.run(main)


def test_pause_mode_is_checked_before_sending() -> None:
    async def main() -> None:
        async with SGLangClient("http://127.0.0.1:9") as client:
            with pytest.raises(UserError, match="pause mode"):
                await client.pause_generation(mode="sleep")  # type: ignore[arg-type]

    anyio.run(main)


def test_update_waits_for_running_requests_or_aborts_them(
    server: str, perturbed_model: Path
) -> None:
    async def main() -> None:
        async with SGLangClient(server) as client:
            old = (await versions(client))[server]
            results: list[GenerateResult] = []

            async def call() -> None:
                request = GenerateRequest(input_ids=PROMPT, sampling=greedy(300, ignore_eos=True))
                results.append(await client.generate(request))

            # Default: the running request ends on the old weights, then the swap happens.
            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                await wait_running(server)
                await client.update_weights_from_disk(str(perturbed_model), weight_version="w1")
                assert len(results) == 1  # finished before the update returned
            assert results[0].finish_reason.type == "length"
            assert results[0].weight_version == old

            # abort_all_requests: the running request returns its partial output at once.
            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                await wait_running(server)
                await client.update_weights_from_disk(
                    str(DEMO_MODEL_PATH), weight_version="w2", abort_all_requests=True
                )
            assert len(results) == 2
            assert results[1].finish_reason.type == "abort"
            assert len(results[1].output_ids) < 300
            assert await versions(client) == {server: "w2"}

    anyio.run(main)


def test_embedded_engine_refuses_another_vocabulary(tiny_model_path: Path) -> None:
    from toolrollout.engines.embedded import EmbeddedEngine

    async def main() -> None:
        async with EmbeddedEngine(DEMO_MODEL_PATH, num_threads=1, max_batch_size=2) as engine:
            before = await engine.generate(GenerateRequest(input_ids=PROMPT, sampling=greedy(3)))
            with pytest.raises(UserError, match="vocab"):
                await engine.update_weights_from_disk(tiny_model_path, weight_version="x")
            assert engine.weight_version == "default"
            assert engine.model_path == str(DEMO_MODEL_PATH)
            after = await engine.generate(GenerateRequest(input_ids=PROMPT, sampling=greedy(3)))
            assert after.output_logprobs == before.output_logprobs  # old weights kept

    anyio.run(main)
