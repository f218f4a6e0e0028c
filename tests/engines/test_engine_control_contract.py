"""One control plane: the same calls, types and effects on every engine.

Each test runs against ``SGLangClient`` (over HTTP, to the embedded server in a thread),
``EmbeddedEngine`` (in-process) and ``ScriptedEngine``, all serving the demo model (or, for
the scripted one, claiming to), and checks what a trainer relies on: ``info()`` reports the
context length and weight version, a pause holds new requests until ``continue``, a weight
update changes the version seen by ``info()`` and by later results, ``abort_all`` ends the
requests in flight with an ``abort`` finish reason, and ``flush_cache`` answers a bool.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import anyio
import pytest
from tests._serve_thread import serve_in_thread

from toolrollout._exceptions import UserError
from toolrollout.apps.demo import DEMO_MODEL_PATH
from toolrollout.engines import (
    Engine,
    EngineInfo,
    GenerateRequest,
    GenerateResult,
    SamplingParams,
    SGLangClient,
    WeightUpdate,
)
from toolrollout.engines.embedded import EmbeddedEngine
from toolrollout.testing import ScriptedEngine, ScriptedOutput

pytestmark = pytest.mark.timeout(120)

DEMO_CONTEXT = 1024
LONG = 900
PROMPT = (1, 2, 3, 4, 5)
CONTROL = (
    "info",
    "pause_generation",
    "continue_generation",
    "update_weights_from_disk",
    "flush_cache",
    "abort_all",
)
ENGINES = ("sglang", "embedded", "scripted")


@dataclass
class Harness:
    engine: Engine
    running: Callable[[], int]
    """Requests the backend is generating now (registered, so an abort reaches them)."""


def _script(request: GenerateRequest) -> ScriptedOutput:
    n = request.sampling.max_new_tokens
    long = n == LONG
    return ScriptedOutput(list(range(1, n + 2)), delay=60.0 if long else 0.0, abort_after=3)


@pytest.fixture(params=ENGINES)
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    kind = request.param
    if kind == "scripted":
        scripted = ScriptedEngine(
            _script, context_length=DEMO_CONTEXT, model_path=str(DEMO_MODEL_PATH)
        )
        yield Harness(scripted, lambda: len(scripted.in_flight))
        return
    embedded = EmbeddedEngine(DEMO_MODEL_PATH, max_batch_size=4, num_threads=1)
    await embedded.start()
    try:
        if kind == "embedded":
            yield Harness(embedded, lambda: embedded.num_running)
            return
        with serve_in_thread(embedded) as url:
            async with SGLangClient(url) as client:
                await client.wait_healthy(timeout=30)
                yield Harness(client, lambda: embedded.num_running)
    finally:
        await embedded.aclose()


def greedy(max_new_tokens: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True)


async def wait_running(h: Harness, count: int = 1) -> None:
    with anyio.fail_after(30):
        while h.running() < count:  # noqa: ASYNC110 - polls a counter in another thread
            await anyio.sleep(0.01)


@pytest.mark.parametrize("engine_type", [SGLangClient, EmbeddedEngine, ScriptedEngine], ids=ENGINES)
def test_every_engine_has_the_same_control_signatures(engine_type: type[Engine]) -> None:
    assert not inspect.isabstract(engine_type)
    for name in CONTROL:
        method = getattr(engine_type, name)
        assert inspect.iscoroutinefunction(method), name
        assert method is not getattr(Engine, name), f"{engine_type.__name__} inherits {name}"
        base = inspect.signature(getattr(Engine, name)).parameters
        mine = inspect.signature(method).parameters
        for param in base.values():  # an engine may add options, never drop or move one
            assert param.name in mine, f"{engine_type.__name__}.{name} lacks {param.name}"
            assert mine[param.name].kind == param.kind, (name, param.name)
            assert mine[param.name].default == param.default, (name, param.name)


async def test_info_reports_what_is_served(harness: Harness) -> None:
    info = await harness.engine.info()
    assert isinstance(info, EngineInfo)
    assert isinstance(info.context_length, int) and info.context_length == DEMO_CONTEXT
    assert info.vision is False
    assert info.model_path == str(DEMO_MODEL_PATH)
    assert info.weight_version == "default"
    assert len(info.servers) == 1
    assert info.servers[0].context_length == DEMO_CONTEXT
    # What serves it, as output files record it: the scripted engine claims no dtype; the
    # embedded one (in process, or behind toolrollout serve over SGLang's API) says float32.
    if info.engine == "scripted":
        assert info.dtype is None
    else:
        assert info.engine == "toolrollout-embedded"
        assert info.engine_version and info.dtype == "float32"


async def test_pause_holds_new_requests_until_continue(harness: Harness) -> None:
    engine = harness.engine
    await engine.pause_generation()
    results: list[GenerateResult] = []
    done = anyio.Event()

    async def call() -> None:
        results.append(await engine.generate(GenerateRequest(PROMPT, sampling=greedy(4))))
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        with anyio.move_on_after(0.5):
            await done.wait()
        assert results == []  # held while paused
        assert harness.running() == 0
        await engine.continue_generation()
    assert results[0].finish_reason.type == "length"
    assert len(results[0].output_ids) == 4


async def test_pause_in_abort_mode_ends_running_requests(harness: Harness) -> None:
    engine = harness.engine
    results: list[GenerateResult] = []
    async with anyio.create_task_group() as tg:

        async def call() -> None:
            results.append(await engine.generate(GenerateRequest(PROMPT, sampling=greedy(LONG))))

        tg.start_soon(call)
        await wait_running(harness)
        await engine.pause_generation(mode="abort")
    assert results[0].finish_reason.type == "abort"
    assert len(results[0].output_ids) < LONG
    await engine.continue_generation()


async def test_update_weights_from_disk_changes_the_weight_version(harness: Harness) -> None:
    engine = harness.engine
    update = await engine.update_weights_from_disk(DEMO_MODEL_PATH, weight_version="step-1")
    assert isinstance(update, WeightUpdate)
    assert update.weight_version == "step-1"
    assert update.model_path == str(DEMO_MODEL_PATH)
    assert len(update.servers) == 1 and update.num_paused_requests == 0
    assert (await engine.info()).weight_version == "step-1"
    result = await engine.generate(GenerateRequest(PROMPT, sampling=greedy(2)))
    assert result.weight_version == "step-1"
    # Without a version the label stays.
    again = await engine.update_weights_from_disk(str(DEMO_MODEL_PATH))
    assert again.weight_version is None
    assert (await engine.info()).weight_version == "step-1"


async def test_abort_all_ends_in_flight_requests(harness: Harness) -> None:
    engine = harness.engine
    results: list[GenerateResult] = []

    async def call(rid: str) -> None:
        request = GenerateRequest(PROMPT, sampling=greedy(LONG), rid=rid)
        results.append(await engine.generate(request))

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(call, "first")
            tg.start_soon(call, "second")
            await wait_running(harness, 2)
            await engine.abort_all()
    assert [r.finish_reason.type for r in results] == ["abort", "abort"]
    assert all(len(r.output_ids) < LONG for r in results)
    after = await engine.generate(GenerateRequest(PROMPT, sampling=greedy(3)))
    assert after.finish_reason.type == "length"  # the engine still serves


async def test_flush_cache_answers_whether_it_flushed(harness: Harness) -> None:
    engine = harness.engine
    assert await engine.flush_cache() is True  # idle
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.generate, GenerateRequest(PROMPT, sampling=greedy(LONG)))
        await wait_running(harness)
        assert await engine.flush_cache() is False  # busy: refused, as SGLang does
        await engine.abort_all()


async def test_an_engine_whose_weights_live_elsewhere_refuses_weight_control() -> None:
    from toolrollout.integrations import VerlServerEngine

    engine = VerlServerEngine(object(), context_length=2048, vision=True)
    info = await engine.info()
    assert (info.context_length, info.vision, info.weight_version) == (2048, True, None)
    await engine.abort_all()  # a no-op: verl aborts whole replicas
    with pytest.raises(UserError, match="VerlServerEngine does not support pause_generation"):
        await engine.pause_generation()
    with pytest.raises(UserError, match="update_weights_from_disk"):
        await engine.update_weights_from_disk("/ckpt")
    with pytest.raises(UserError, match="flush_cache"):
        await engine.flush_cache()
    with pytest.raises(UserError, match="continue_generation"):
        await engine.continue_generation()


async def test_generate_stream_ends_with_what_generate_returns(harness: Harness) -> None:
    """The seam's token stream: cumulative chunks while decoding, then the result
    ``generate`` returns for the same (greedy) request: same ids, logprobs, finish."""
    engine = harness.engine
    request = GenerateRequest(PROMPT, sampling=greedy(8))
    whole = await engine.generate(request)
    chunks = [chunk async for chunk in engine.generate_stream(request)]
    *partial, last = chunks
    assert last.result is not None and not any(c.finished for c in partial)
    streamed = last.result
    assert streamed.output_ids == whole.output_ids and len(whole.output_ids) == 8
    assert streamed.output_logprobs == whole.output_logprobs
    assert streamed.finish_reason == whole.finish_reason
    # Chunks arrive while decoding; how many depends on load (a busy server coalesces them,
    # as SGLang does with its stream interval), so only "more than the final one" is checked.
    assert partial
    for chunk in chunks:
        assert chunk.output_ids == whole.output_ids[: len(chunk.output_ids)]
        assert chunk.output_logprobs is not None
        assert len(chunk.output_logprobs) == len(chunk.output_ids)
    assert sum(len(c.new_ids) for c in chunks) == len(whole.output_ids)
