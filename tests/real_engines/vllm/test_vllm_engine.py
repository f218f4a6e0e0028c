"""Every method of :class:`VLLMClient` against the real vLLM server (one per module).

Data plane: ids and sampled-token logprobs, finish reasons (EOS, stop token, length,
abort), seeds, cached tokens, an overlong prompt, abort of an in-flight request keeping
its partial ids. Control plane: detection from the URL, info, loads and metrics, pause
modes and resume, weight reload (a changed checkpoint changes the output, a version label
follows, the prefix cache is reset), rejected folders that leave the old weights served.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import anyio.abc
import pytest

from tests._serve_thread import demo_server_in_thread
from tests.real_engines.vllm._server import VLLMServer
from toolrollout.apps.demo import DEMO_MODEL_PATH, load_demo_prompts
from toolrollout.engines import GenerateRequest, GenerateResult, SamplingParams, VLLMClient
from toolrollout.engines._factory import connect
from toolrollout.exceptions import OverlongPromptError, UserError

pytestmark = [pytest.mark.real_engine, pytest.mark.slow, pytest.mark.timeout(900)]

EOS = 2  # the demo model's <|im_end|>


@pytest.fixture(scope="module")
def vllm_server(vllm_untied: VLLMServer) -> VLLMServer:
    """The session's untied server (conftest.py), which may be reloaded."""
    return vllm_untied


@pytest.fixture
async def engine(vllm_server: VLLMServer) -> AsyncIterator[VLLMClient]:
    async with VLLMClient(vllm_server.url) as client:
        await client.wait_healthy(timeout=30)
        try:
            yield client
        finally:  # a test that failed while paused must not leave the session's server so
            with anyio.fail_after(60):
                await client.continue_generation()


@pytest.fixture(scope="module")
def chat_prompt() -> list[int]:
    """A demo prompt rendered by the model's own template: the model answers and stops."""
    from transformers import AutoTokenizer

    from toolrollout.tools.calculator import CALCULATOR_TOOL

    tokenizer = AutoTokenizer.from_pretrained(str(DEMO_MODEL_PATH))
    messages = load_demo_prompts()[0]["messages"]
    text = tokenizer.apply_chat_template(
        list(messages), tools=[CALCULATOR_TOOL], add_generation_prompt=True, tokenize=False
    )
    return list(tokenizer.encode(text, add_special_tokens=False))


def greedy(ids: list[int], tokens: int = 24, **extra: object) -> GenerateRequest:
    return GenerateRequest(
        input_ids=ids,
        sampling=SamplingParams(max_new_tokens=tokens, temperature=0.0, **extra),  # type: ignore[arg-type]
    )


async def generated_tokens(engine: VLLMClient) -> float:
    return (await engine.metrics()).get("vllm:generation_tokens_total", 0.0)


async def until_generating(engine: VLLMClient, since: float, tokens: int = 8) -> None:
    """Wait until the server has generated ``tokens`` tokens after the count ``since``."""
    with anyio.fail_after(120):
        while True:
            if await generated_tokens(engine) >= since + tokens:
                return
            await anyio.sleep(0.02)


HOLD_TRIES = 6


async def start_held(
    engine: VLLMClient, tg: anyio.abc.TaskGroup, request: GenerateRequest
) -> list[GenerateResult]:
    """Start ``request`` in ``tg`` and hold it mid-generation with an in-place pause; its
    result lands in the returned list once the test resumes or aborts it.

    The demo model decodes about a thousand tokens a second here, so a request can end
    between the poll that sees it decoding and the pause. Whether the pause held it is
    read from the server (``vllm:num_requests_running``); a try whose request had already
    ended proves nothing and is repeated. Every try failing means the pause holds nothing.
    """

    async def run(results: list[GenerateResult], ended: anyio.Event) -> None:
        results.append(await engine.generate(request))
        ended.set()

    for _ in range(HOLD_TRIES):
        results: list[GenerateResult] = []
        ended = anyio.Event()
        since = await generated_tokens(engine)
        tg.start_soon(run, results, ended)
        await until_generating(engine, since)
        await engine.pause_generation("in_place")
        await anyio.sleep(0.3)  # the gauge is set from the engine's last step
        if (await engine.metrics()).get("vllm:num_requests_running", 0.0) >= 1:
            return results
        await engine.continue_generation()
        with anyio.fail_after(60):
            await ended.wait()  # it ended before the pause: let its answer arrive
    pytest.fail(f"the in-place pause held no running request in {HOLD_TRIES} tries")


def check_shape(result: GenerateResult) -> None:
    assert result.output_logprobs is not None
    assert len(result.output_logprobs) == len(result.output_ids) == result.completion_tokens
    assert all(lp <= 0.0 for lp in result.output_logprobs)


# ---------------------------------------------------------------- detection


@pytest.fixture(scope="module")
def sglang_like() -> Iterator[str]:
    """``toolrollout serve`` (SGLang's API) in a thread."""
    with demo_server_in_thread() as url:
        yield url


async def test_connect_finds_vllm_and_refuses_a_mix_or_a_wrong_name(
    vllm_server: VLLMServer, sglang_like: str
) -> None:
    engine = await connect([vllm_server.url], health_timeout=30)
    async with engine:
        assert isinstance(engine, VLLMClient)
    with pytest.raises(UserError, match=r"^--engine sglang, but .* serves vllm$"):
        await connect([vllm_server.url], health_timeout=30, engine="sglang")
    with pytest.raises(UserError, match="mixes engine kinds") as refused:
        await connect([vllm_server.url, sglang_like], health_timeout=30)
    message = str(refused.value)
    assert "\n" not in message and "(vllm)" in message and "(sglang)" in message


# ---------------------------------------------------------------- data plane


async def test_eos_stop_token_length_and_reproducible_ids(
    engine: VLLMClient, chat_prompt: list[int]
) -> None:
    first = await engine.generate(greedy(chat_prompt, 200))
    check_shape(first)
    assert first.finish_reason.type == "stop" and first.finish_reason.matched == EOS
    assert first.output_ids[-1] == EOS  # the EOS id is kept, with its logprob
    assert first.prompt_tokens == len(chat_prompt)
    again = await engine.generate(greedy(chat_prompt, 200))
    assert again.output_ids == first.output_ids

    stop_id = first.output_ids[3]
    stopped = await engine.generate(greedy(chat_prompt, 200, stop_token_ids=(stop_id,)))
    assert stopped.finish_reason.type == "stop" and stopped.finish_reason.matched == stop_id
    assert stopped.output_ids == first.output_ids[: first.output_ids.index(stop_id) + 1]

    short = await engine.generate(greedy(chat_prompt, 3))
    assert short.finish_reason.type == "length" and short.finish_reason.length == 3
    assert short.output_ids == first.output_ids[:3]


async def test_a_seed_fixes_sampled_ids_and_the_sampling_fields_reach_the_server(
    engine: VLLMClient, chat_prompt: list[int]
) -> None:
    def sampled(seed: int) -> GenerateRequest:
        return GenerateRequest(
            input_ids=chat_prompt,
            sampling=SamplingParams(max_new_tokens=40, temperature=1.0, seed=seed, ignore_eos=True),
        )

    one, two, other = [await engine.generate(sampled(s)) for s in (7, 7, 8)]
    assert one.output_ids == two.output_ids != other.output_ids
    # ignore_eos and max_new_tokens were read (SGLang's names would be silently ignored)
    assert len(one.output_ids) == 40 and one.finish_reason.type == "length"


async def test_cached_tokens_are_reported(engine: VLLMClient) -> None:
    prompt = [11, 12] * 150  # no other test sends this prefix
    cold = await engine.generate(greedy(prompt, 2))
    warm = await engine.generate(greedy(prompt, 2))
    assert cold.cached_tokens == 0 < warm.cached_tokens <= len(prompt)


async def test_an_overlong_prompt_is_one_clear_error(engine: VLLMClient) -> None:
    with pytest.raises(OverlongPromptError) as raised:
        await engine.generate(greedy([5] * 1030, 4))
    assert "longer than the maximum model length" in str(raised.value)
    assert "\n" not in str(raised.value)


async def test_abort_of_an_in_flight_request_keeps_its_partial_ids(
    engine: VLLMClient, chat_prompt: list[int]
) -> None:
    """Aborted by its id while a pause holds it mid-generation (so it cannot end first)."""
    sampling = SamplingParams(max_new_tokens=900, temperature=1.0, seed=3, ignore_eos=True)
    async with anyio.create_task_group() as tg:
        results = await start_held(
            engine, tg, GenerateRequest(chat_prompt, sampling=sampling, rid="long-1")
        )
        await engine.abort("long-1")
        await engine.continue_generation()
    (aborted,) = results
    check_shape(aborted)
    assert aborted.finish_reason.type == "abort"
    assert 0 < len(aborted.output_ids) < 900
    # the partial ids are the ones the same seeded request samples
    full = await engine.generate(GenerateRequest(chat_prompt, sampling=sampling))
    assert full.output_ids[: len(aborted.output_ids)] == aborted.output_ids


# ---------------------------------------------------------------- control plane


async def test_info_loads_metrics_and_logprob_mode(
    engine: VLLMClient, vllm_server: VLLMServer, chat_prompt: list[int]
) -> None:
    await engine.generate(greedy(chat_prompt, 2))
    info = await engine.info()
    assert info.context_length == 1024 and info.vision is False
    assert info.model_path == str(vllm_server.model)
    assert (info.engine, info.dtype) == ("vllm", "float32")  # what the output files record
    assert info.engine_version is not None and info.engine_version.startswith("0.")
    assert await engine.logprobs_mode() == "processed_logprobs"
    assert await engine.logprob_mismatch(SamplingParams(temperature=0.7)) is None
    problem = await engine.logprob_mismatch(SamplingParams(temperature=0.7, top_p=0.9))
    assert problem is not None and "top_p=0.9" in problem and "\n" not in problem
    loads = (await engine.get_loads())["loads"]
    assert loads[0]["num_running_reqs"] == 0 and 0.0 <= loads[0]["token_usage"] <= 1.0
    metrics = await engine.metrics()
    assert metrics["vllm:prefix_cache_queries_total"] > 0
    # get_loads() defaults a missing sample to 0: the names it reads must be served.
    read = {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"}
    assert read <= set(metrics), read - set(metrics)


async def test_pause_in_place_keeps_requests_and_new_ones_wait(
    engine: VLLMClient, chat_prompt: list[int]
) -> None:
    long = GenerateRequest(
        chat_prompt, sampling=SamplingParams(max_new_tokens=600, ignore_eos=True, seed=1)
    )
    new: list[GenerateResult] = []

    async def run_new() -> None:
        new.append(await engine.generate(greedy(chat_prompt, 4)))

    async with anyio.create_task_group() as tg:
        kept = await start_held(engine, tg, long)
        tg.start_soon(run_new)
        await anyio.sleep(2.0)
        assert kept == new == [], "a request finished while the server was paused"
        await engine.continue_generation()
    assert kept[0].finish_reason.type == "length" and len(kept[0].output_ids) == 600
    assert len(new[0].output_ids) == 4


async def test_pause_abort_ends_running_requests_with_their_partial_output(
    engine: VLLMClient, chat_prompt: list[int]
) -> None:
    """An abort pause ends a request held mid-generation with its partial output (held
    first, so that it cannot end on its own before the pause reaches the server)."""
    long = GenerateRequest(
        chat_prompt, sampling=SamplingParams(max_new_tokens=900, ignore_eos=True)
    )
    async with anyio.create_task_group() as tg:
        done = await start_held(engine, tg, long)
        await engine.pause_generation("abort")
    await engine.continue_generation()
    assert done[0].finish_reason.type == "abort" and 0 < len(done[0].output_ids) < 900
    assert len((await engine.generate(greedy(chat_prompt, 2))).output_ids) == 2


# ---------------------------------------------------------------- weights


@pytest.fixture
def changed_weights(vllm_server: VLLMServer, tmp_path: Path) -> Iterator[Path]:
    """The served checkpoint with its final norm's weight scaled: another greedy output."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "step-1"
    shutil.copytree(vllm_server.model, folder)
    tensors = load_file(folder / "model.safetensors")
    tensors["model.norm.weight"] = tensors["model.norm.weight"] * -3.0
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    yield folder


async def test_reload_changes_the_output_labels_it_and_resets_the_prefix_cache(
    engine: VLLMClient, vllm_server: VLLMServer, chat_prompt: list[int], changed_weights: Path
) -> None:
    before = await engine.generate(greedy(chat_prompt))
    assert (await engine.generate(greedy(chat_prompt))).cached_tokens > 0
    update = await engine.update_weights_from_disk(changed_weights, weight_version="step-1")
    assert update.model_path == str(changed_weights) and update.weight_version == "step-1"
    after = await engine.generate(greedy(chat_prompt))
    assert after.output_ids != before.output_ids
    assert after.weight_version == "step-1" and after.cached_tokens == 0
    info = await engine.info()
    assert info.weight_version == "step-1" and info.model_path == str(changed_weights)

    await engine.update_weights_from_disk(vllm_server.model, weight_version="step-2")
    restored = await engine.generate(greedy(chat_prompt))
    assert restored.output_ids == before.output_ids and restored.weight_version == "step-2"


async def test_rejected_folders_leave_the_old_weights_served(
    engine: VLLMClient, vllm_server: VLLMServer, chat_prompt: list[int], tmp_path: Path
) -> None:
    from safetensors.torch import load_file, save_file

    before = await engine.generate(greedy(chat_prompt))
    with pytest.raises(UserError, match="does not exist"):
        await engine.update_weights_from_disk(tmp_path / "missing", weight_version="bad")
    wrong = tmp_path / "wrong-shape"
    shutil.copytree(vllm_server.model, wrong)
    tensors = load_file(wrong / "model.safetensors")
    name = "model.layers.0.mlp.gate_proj.weight"
    tensors[name] = tensors[name].t().contiguous()
    save_file(tensors, wrong / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UserError, match=f"tensor '{name}' has shape") as refused:
        await engine.update_weights_from_disk(wrong, weight_version="bad")
    assert "\n" not in str(refused.value)
    after = await engine.generate(greedy(chat_prompt))
    assert after.output_ids == before.output_ids
    assert after.weight_version == before.weight_version != "bad"
