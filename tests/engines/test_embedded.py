"""The embedded engine against an independent reference: a plain forward pass of the model."""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from toolrollout._exceptions import (
    EngineError,
    EngineRequestRejected,
    OverlongPromptError,
    UserError,
)
from toolrollout.engines._types import GenerateRequest, GenerateResult, SamplingParams
from toolrollout.engines.embedded import EmbeddedEngine, GenerationOptions

PROMPTS = [
    "Hello world",
    "The quick brown fox",
    "calculator 12 + 34",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "stop",
    "Tool-calling rollouts for reinforcement learning",
]


@pytest.fixture(scope="module")
def engine(tiny_model_path: Path) -> Iterator[EmbeddedEngine]:
    eng = EmbeddedEngine(tiny_model_path, max_batch_size=16, num_threads=1)
    asyncio.run(eng.start())
    yield eng
    asyncio.run(eng.aclose())


@pytest.fixture(scope="module")
def reference_model(tiny_model_path: Path) -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    return model.eval()  # type: ignore[no-untyped-call]


def ids_of(engine: EmbeddedEngine, text: str) -> tuple[int, ...]:
    return tuple(engine.tokenize(text))


def request(ids: tuple[int, ...], rid: str | None = None, **sampling: Any) -> GenerateRequest:
    return GenerateRequest(input_ids=ids, sampling=SamplingParams(**sampling), rid=rid)


def reference_logprobs(
    model: Any, prompt: tuple[int, ...], output: tuple[int, ...], temperature: float
) -> list[float]:
    """log_softmax(logits / T) of each output token from one full forward pass."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([list(prompt) + list(output[:-1])])).logits[0]
    steps = logits[len(prompt) - 1 :].float() / temperature
    logprobs = torch.log_softmax(steps, dim=-1)
    return [float(logprobs[i, t]) for i, t in enumerate(output)]


async def until(predicate: Callable[[], bool], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def greedy(engine: EmbeddedEngine, ids: tuple[int, ...], n: int) -> GenerateResult:
    return await engine.generate(request(ids, max_new_tokens=n, temperature=0, ignore_eos=True))


# ---------------------------------------------------------------------------- logprobs
@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.3])
async def test_logprobs_are_temperature_scaled_log_softmax_of_a_plain_forward(
    engine: EmbeddedEngine, reference_model: Any, temperature: float
) -> None:
    prompt = ids_of(engine, PROMPTS[1])
    result = await engine.generate(
        request(prompt, max_new_tokens=12, temperature=temperature, seed=3, ignore_eos=True)
    )
    assert result.output_logprobs is not None
    assert len(result.output_logprobs) == len(result.output_ids) == 12
    effective_t = 1.0 if temperature == 0.0 else temperature  # greedy => T=1 (SGLang)
    expected = reference_logprobs(reference_model, prompt, result.output_ids, effective_t)
    assert result.output_logprobs == pytest.approx(expected, abs=1e-4)


async def test_greedy_picks_the_argmax_of_the_reference(
    engine: EmbeddedEngine, reference_model: Any
) -> None:
    prompt = ids_of(engine, PROMPTS[0])
    result = await greedy(engine, prompt, 10)
    ids = list(prompt)
    with torch.no_grad():
        for token in result.output_ids:
            assert (
                int(reference_model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()) == token
            )
            ids.append(token)


async def test_prompt_logprobs_and_top_logprobs(
    engine: EmbeddedEngine, reference_model: Any
) -> None:
    prompt = ids_of(engine, PROMPTS[2])
    req = request(prompt, max_new_tokens=4, temperature=0)
    full = await engine.generate_full(
        req, GenerationOptions(logprob_start_len=0, top_logprobs_num=3)
    )
    assert full.input_token_ids == prompt
    assert full.input_logprobs[0] is None  # the first prompt token has no context
    with torch.no_grad():
        logits = reference_model(input_ids=torch.tensor([list(prompt)])).logits[0]
    ref = torch.log_softmax(logits.float(), dim=-1)
    expected = [float(ref[i - 1, prompt[i]]) for i in range(1, len(prompt))]
    assert list(full.input_logprobs[1:]) == pytest.approx(expected, abs=1e-4)
    assert full.input_top_logprobs[0] is None
    for top, lp in zip(full.output_top_logprobs, full.output_logprobs, strict=True):
        assert len(top) == 3
        assert [v for v, _ in top] == sorted((v for v, _ in top), reverse=True)
        assert top[0][0] == pytest.approx(lp)  # greedy: the chosen token is the best one

    later = await engine.generate_full(req, GenerationOptions(logprob_start_len=3))
    assert later.input_token_ids == prompt[3:]
    assert list(later.input_logprobs) == pytest.approx(expected[2:], abs=1e-4)
    none = await engine.generate_full(req, GenerationOptions(logprob_start_len=-1))
    assert none.input_logprobs == () and none.input_token_ids == ()


# ---------------------------------------------------------------------------- batching
async def test_batched_greedy_equals_unbatched(engine: EmbeddedEngine) -> None:
    prompts = [ids_of(engine, p) for p in PROMPTS]
    lengths = [5 + 3 * i for i in range(len(prompts))]  # rows finish at different steps
    alone = [await greedy(engine, p, n) for p, n in zip(prompts, lengths, strict=True)]

    async def staggered(i: int) -> GenerateResult:
        await asyncio.sleep(0.01 * (i % 3))  # some join while others are mid-decode
        return await greedy(engine, prompts[i], lengths[i])

    together = await asyncio.gather(*(staggered(i) for i in range(len(prompts))))
    for a, b in zip(alone, together, strict=True):
        assert a.output_ids == b.output_ids
        assert a.output_logprobs is not None and b.output_logprobs is not None
        assert b.output_logprobs == pytest.approx(a.output_logprobs, abs=1e-4)
        assert b.finish_reason.type == "length"


async def test_requests_finish_independently(engine: EmbeddedEngine) -> None:
    prompt = ids_of(engine, PROMPTS[3])
    long = asyncio.create_task(greedy(engine, prompt, 200))
    await until(lambda: engine.num_running == 1)  # the long one is decoding
    short = await greedy(engine, ids_of(engine, PROMPTS[0]), 3)
    assert short.completion_tokens == 3
    assert not long.done(), "the short request waited for the long one"
    assert (await long).completion_tokens == 200


async def test_sixteen_concurrent_requests_share_their_decode_steps(
    engine: EmbeddedEngine,
) -> None:
    # Counted in forward passes, not seconds: a loaded CI machine once made 16 batched
    # requests take 14x one request's wall time, though they shared every step.
    prompt = ids_of(engine, PROMPTS[5])
    await greedy(engine, prompt, 4)  # warm up
    steps0, rows0 = engine.decode_counts
    await engine.generate(request(prompt, max_new_tokens=48, ignore_eos=True))
    steps1, rows1 = engine.decode_counts
    assert (steps1 - steps0, rows1 - rows0) == (47, 47)  # the first token comes from prefill
    results = await asyncio.gather(
        *(engine.generate(request(prompt, max_new_tokens=48, ignore_eos=True)) for _ in range(16))
    )
    steps2, rows2 = engine.decode_counts
    assert all(r.completion_tokens == 48 for r in results)
    assert rows2 - rows1 == 16 * 47
    # unbatched this is 752 steps; batched, late arrivals add at most a few steps each
    assert steps2 - steps1 <= 2 * 47, f"{steps2 - steps1} decode steps for 16 x 47 tokens"
    assert (rows2 - rows1) / (steps2 - steps1) >= 8, "the mean decode batch is under 8"


# ---------------------------------------------------------------------------- sampling
async def test_same_seed_same_output_and_seeds_differ(engine: EmbeddedEngine) -> None:
    prompt = ids_of(engine, PROMPTS[4])

    async def sample(seed: int) -> tuple[int, ...]:
        r = await engine.generate(request(prompt, max_new_tokens=16, seed=seed, ignore_eos=True))
        return r.output_ids

    first = await sample(11)
    again = await asyncio.gather(sample(11), sample(11))  # also inside one batch
    assert list(again) == [first, first]
    others = {await sample(s) for s in range(5)}
    assert len(others) > 1


async def test_top_k_one_is_greedy_whatever_the_temperature(engine: EmbeddedEngine) -> None:
    prompt = ids_of(engine, PROMPTS[1])
    expected = (await greedy(engine, prompt, 12)).output_ids
    for seed in (1, 2):
        r = await engine.generate(
            request(prompt, max_new_tokens=12, temperature=1.5, top_k=1, seed=seed, ignore_eos=True)
        )
        assert r.output_ids == expected


async def test_top_p_and_min_p_restrict_to_the_top_token(engine: EmbeddedEngine) -> None:
    prompt = ids_of(engine, PROMPTS[1])
    expected = (await greedy(engine, prompt, 8)).output_ids
    tiny_p = await engine.generate(
        request(prompt, max_new_tokens=8, top_p=1e-6, seed=5, ignore_eos=True)
    )
    full_min_p = await engine.generate(
        request(prompt, max_new_tokens=8, min_p=1.0, seed=5, ignore_eos=True)
    )
    assert tiny_p.output_ids == expected
    assert full_min_p.output_ids == expected


# ---------------------------------------------------------------------------- stopping
async def test_max_new_tokens_ends_with_length(engine: EmbeddedEngine) -> None:
    r = await greedy(engine, ids_of(engine, PROMPTS[0]), 7)
    assert r.completion_tokens == 7 and len(r.output_ids) == 7
    assert r.finish_reason.type == "length" and r.finish_reason.length == 7


def _first_new(tokens: tuple[int, ...], start: int) -> int:
    """Index of a token at or after ``start`` that does not occur before it."""
    for i in range(start, len(tokens)):
        if tokens[i] not in tokens[:i]:
            return i
    raise AssertionError(f"no fresh token in {tokens}")


async def test_stop_token_is_included_in_output_ids(engine: EmbeddedEngine) -> None:
    prompt = ids_of(engine, PROMPTS[2])
    free = (await greedy(engine, prompt, 20)).output_ids
    k = _first_new(free, 3)
    r = await engine.generate(
        request(prompt, max_new_tokens=20, temperature=0, stop_token_ids=(free[k],))
    )
    assert r.output_ids == free[: k + 1]
    assert r.finish_reason.type == "stop" and r.finish_reason.matched == free[k]
    assert r.output_logprobs is not None and len(r.output_logprobs) == k + 1
    ignored = await engine.generate(
        request(
            prompt, max_new_tokens=20, temperature=0, stop_token_ids=(free[k],), ignore_eos=True
        )
    )
    assert ignored.output_ids == free  # ignore_eos disables every token stop, as in SGLang


async def test_generation_config_eos_is_a_default_stop(
    engine: EmbeddedEngine, tiny_model_path: Path, tmp_path: Path
) -> None:
    prompt = ids_of(engine, PROMPTS[0])
    free = (await greedy(engine, prompt, 20)).output_ids
    k = _first_new(free, 2)
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model_path, model_dir)
    gen_config = json.loads((model_dir / "generation_config.json").read_text())
    gen_config["eos_token_id"] = [engine.tokenizer.eos_token_id, free[k]]
    (model_dir / "generation_config.json").write_text(json.dumps(gen_config))
    async with EmbeddedEngine(model_dir, num_threads=1) as other:
        assert free[k] in other.eos_token_ids
        assert other.tokenizer.eos_token_id in other.eos_token_ids
        stopped = await other.generate(request(prompt, max_new_tokens=20, temperature=0))
        kept_going = await greedy(other, prompt, 20)
    assert stopped.output_ids == free[: k + 1]
    assert stopped.finish_reason.type == "stop" and stopped.finish_reason.matched == free[k]
    assert kept_going.output_ids == free


def _clean_piece(engine: EmbeddedEngine, token: int) -> str | None:
    text = str(engine.tokenizer.decode([token]))
    return text if text.strip() and "\ufffd" not in text else None


async def test_stop_string_ends_at_the_completing_token_and_is_trimmed_from_text(
    engine: EmbeddedEngine,
) -> None:
    decode = engine.tokenizer.decode
    for text in PROMPTS:
        prompt = ids_of(engine, text)
        free = (await greedy(engine, prompt, 24)).output_ids
        for k in range(2, len(free)):
            stop = _clean_piece(engine, free[k])
            if stop is not None and stop not in decode(list(free[:k])):
                break
        else:
            continue
        # Where SGLang's rule (stop string inside the decoded tail) first fires.
        end = next(i for i in range(1, len(free) + 1) if stop in decode(list(free[:i])))
        req = request(prompt, max_new_tokens=24, temperature=0, stop=(stop,))
        kept = await engine.generate_full(req, GenerationOptions(no_stop_trim=True))
        trimmed = await engine.generate_full(req, GenerationOptions(no_stop_trim=False))
        assert kept.output_ids == trimmed.output_ids == free[:end]
        assert kept.finish_reason is not None and kept.finish_reason.matched == stop
        full_text = decode(list(free[:end]))
        assert kept.text == full_text
        assert trimmed.text == full_text[: full_text.find(stop)]
        return
    pytest.fail("no usable stop string found in the tiny model's outputs")


async def test_eos_trimmed_from_text_unless_no_stop_trim(engine: EmbeddedEngine) -> None:
    prompt = ids_of(engine, PROMPTS[2])
    free = (await greedy(engine, prompt, 12)).output_ids
    k = _first_new(free, 3)
    req = request(prompt, max_new_tokens=12, temperature=0, stop_token_ids=(free[k],))
    decode = engine.tokenizer.decode
    kept = await engine.generate_full(req, GenerationOptions(no_stop_trim=True))
    trimmed = await engine.generate_full(req, GenerationOptions(no_stop_trim=False))
    assert kept.output_ids == trimmed.output_ids == free[: k + 1]
    assert trimmed.text == decode(list(free[:k]), skip_special_tokens=False)
    assert kept.text == decode(list(free[: k + 1]), skip_special_tokens=False)


async def test_stream_yields_cumulative_snapshots(engine: EmbeddedEngine) -> None:
    prompt = ids_of(engine, PROMPTS[0])
    expected = (await greedy(engine, prompt, 6)).output_ids
    snapshots = [s async for s in engine.stream(request(prompt, max_new_tokens=6, temperature=0))]
    assert snapshots[-1].finished and snapshots[-1].output_ids == expected
    assert all(not s.finished for s in snapshots[:-1])
    for s in snapshots:
        assert s.output_ids == expected[: len(s.output_ids)]
        assert len(s.output_logprobs) == len(s.output_ids)


# ---------------------------------------------------------------------------- abort
async def test_abort_running_request_returns_partial_output(engine: EmbeddedEngine) -> None:
    prompt = ids_of(engine, PROMPTS[3])
    req = request(
        prompt, rid="episode-7-turn-2", max_new_tokens=220, temperature=0, ignore_eos=True
    )
    seen = 0
    async for snapshot in engine.stream(req):
        seen = len(snapshot.output_ids)
        if seen == 5:
            await engine.abort("episode-7")  # prefix match, like SGLang's scheduler
        if snapshot.finished:
            final = snapshot
            break
    assert final.finish_reason is not None and final.finish_reason.type == "abort"
    assert 5 <= final.completion_tokens < 220
    assert len(final.output_logprobs) == final.completion_tokens
    expected = (await greedy(engine, prompt, final.completion_tokens)).output_ids
    assert final.output_ids == expected


def slow_down(monkeypatch: pytest.MonkeyPatch, engine: EmbeddedEngine, seconds: float) -> None:
    """Make every forward pass take ``seconds`` longer, so timing claims are unambiguous."""
    model = engine._model
    assert model is not None
    original = model.forward

    def slow(*args: Any, **kwargs: Any) -> Any:
        time.sleep(seconds)
        return original(*args, **kwargs)

    monkeypatch.setattr(model, "forward", slow)


async def test_abort_while_waiting_and_cancellation(
    tiny_model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with EmbeddedEngine(tiny_model_path, max_batch_size=1, num_threads=1) as eng:
        slow_down(monkeypatch, eng, 0.02)  # the running request would need >= 4 s
        prompt = ids_of(eng, PROMPTS[1])
        running = asyncio.create_task(
            eng.generate(request(prompt, rid="run", max_new_tokens=200, ignore_eos=True))
        )
        await until(lambda: eng.num_running == 1)
        waiting = asyncio.create_task(
            eng.generate(request(prompt, rid="wait", max_new_tokens=5, ignore_eos=True))
        )
        await until(lambda: eng.num_waiting == 1)  # moved from the inbox between steps
        await eng.abort("wait")
        result = await waiting
        assert result.finish_reason.type == "abort"
        assert result.finish_reason.message == "Abort in waiting queue"
        assert result.output_ids == ()
        # Cancelling the caller aborts its request at once and frees the only batch slot.
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        await until(lambda: eng.num_active == 0 and eng.num_running == 0, within=2.0)
        quick = await eng.generate(request(prompt, max_new_tokens=3, ignore_eos=True))
        assert quick.completion_tokens == 3


# ---------------------------------------------------------------------------- rejections
async def test_overlong_prompt_is_rejected_with_sglangs_messages(engine: EmbeddedEngine) -> None:
    context = engine.context_length
    with pytest.raises(OverlongPromptError) as too_long:
        await engine.generate(request((5,) * context, max_new_tokens=1))
    assert too_long.value.status_code == 400
    assert str(too_long.value) == (
        f"The input ({context} tokens) is longer than the model's context length "
        f"({context} tokens)."
    )
    with pytest.raises(OverlongPromptError) as no_room:
        await engine.generate(request((5,) * 10, max_new_tokens=context))
    assert str(no_room.value).startswith(
        f"Requested token count exceeds the model's maximum context length of {context} "
        f"tokens. You requested a total of {context + 10} tokens: 10 tokens from the input "
        f"messages and {context} tokens for the completion."
    )
    fits = await engine.generate(request((5,) * 10, max_new_tokens=context - 10, temperature=0))
    assert fits.prompt_tokens + fits.completion_tokens <= context


@pytest.mark.parametrize(
    ("sampling", "message"),
    [
        ({"temperature": -1.0}, "temperature must be a non-negative finite number, got -1.0."),
        (
            {"temperature": float("nan")},
            "temperature must be a non-negative finite number, got nan.",
        ),
        ({"top_p": 0.0}, "top_p must be in (0, 1], got 0.0."),
        ({"top_p": 1.5}, "top_p must be in (0, 1], got 1.5."),
        ({"min_p": 2.0}, "min_p must be in [0, 1], got 2.0."),
        ({"top_k": 0}, "top_k must be -1 (disable) or at least 1, got 0."),
        ({"max_new_tokens": -1}, "max_new_tokens must be at least 0, got -1."),
    ],
)
async def test_bad_sampling_values_are_rejected(
    engine: EmbeddedEngine, sampling: dict[str, Any], message: str
) -> None:
    with pytest.raises(EngineRequestRejected) as info:
        await engine.generate(request((1, 2, 3), **sampling))
    assert str(info.value) == message
    assert info.value.status_code == 400


async def test_other_rejections(engine: EmbeddedEngine) -> None:
    with pytest.raises(EngineRequestRejected, match="no image understanding"):
        await engine.generate(
            GenerateRequest(input_ids=(1, 2), image_data=("data:image/png;base64,AAAA",))
        )
    with pytest.raises(EngineRequestRejected, match="input_ids cannot be empty"):
        await engine.generate(request(()))
    with pytest.raises(EngineRequestRejected, match="greater than the vocab size"):
        await engine.generate(request((1, engine.vocab_size)))
    with pytest.raises(UserError, match="one sample per call"):
        await engine.generate(request((1, 2), n=2))
    slow = asyncio.create_task(engine.generate(request((1, 2), rid="dup", max_new_tokens=100)))
    await until(lambda: engine.num_active == 1)  # rid "dup" is registered
    with pytest.raises(EngineRequestRejected, match="Duplicate request ID detected: dup"):
        await engine.generate(request((1, 2), rid="dup"))
    await slow
    # ... and the engine keeps serving after every rejection.
    assert (await greedy(engine, (1, 2, 3), 2)).completion_tokens == 2


async def test_max_new_tokens_zero_returns_no_tokens(engine: EmbeddedEngine) -> None:
    r = await engine.generate(request((1, 2, 3), max_new_tokens=0))
    assert r.output_ids == () and r.finish_reason.type == "length"


# ---------------------------------------------------------------------------- lifecycle
async def test_lifecycle_start_required_and_thread_joined(tiny_model_path: Path) -> None:
    eng = EmbeddedEngine(tiny_model_path, num_threads=1)
    with pytest.raises(UserError, match="not started"):
        await eng.generate(request((1, 2)))
    await eng.start()
    thread = eng._scheduler._thread  # type: ignore[union-attr]
    assert thread.is_alive() and thread is not threading.current_thread()
    pending = asyncio.create_task(
        eng.generate(request((1, 2), max_new_tokens=250, ignore_eos=True))
    )
    await until(lambda: eng.num_running == 1)  # in flight
    await eng.aclose()
    assert not thread.is_alive()
    closed = await pending  # in-flight requests end as aborted, nobody hangs
    assert closed.finish_reason.type == "abort"
    with pytest.raises(UserError):
        await eng.start()


async def test_a_failing_forward_fails_its_requests_but_not_the_engine(
    tiny_model_path: Path,
) -> None:
    async with EmbeddedEngine(tiny_model_path, num_threads=1) as eng:
        model = eng._model
        assert model is not None
        original = model.forward
        calls = {"n": 0}

        def flaky(*args: Any, **kwargs: Any) -> Any:
            calls["n"] += 1
            if calls["n"] == 2:  # the first decode step
                raise RuntimeError("boom")
            return original(*args, **kwargs)

        model.forward = flaky  # type: ignore[method-assign]
        with pytest.raises(EngineError, match="boom"):
            await eng.generate(request((1, 2, 3), max_new_tokens=5, ignore_eos=True))
        ok = await eng.generate(request((1, 2, 3), max_new_tokens=5, ignore_eos=True))
        assert ok.completion_tokens == 5
        assert eng.healthy


async def test_tokens_are_labelled_with_the_weights_that_sampled_them(
    engine: EmbeddedEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SGLang's ``meta_info.weight_versions``: a version change mid-request splits the
    output into runs, each labelled with the version current when its tokens were made."""
    slow_down(monkeypatch, engine, 0.002)
    slow = asyncio.create_task(greedy(engine, (1, 2), 150))
    try:
        await until(lambda: engine.num_running == 1)
        await asyncio.sleep(0.05)
        engine.weight_version = "step-4"
        result = await slow
    finally:
        engine.weight_version = "default"
    (first, first_end, old), (second, end, new) = result.weight_spans
    assert (first, old, new, end) == (0, "default", "step-4", 150)
    assert 0 < first_end == second < 150
    assert result.weight_version == "step-4"
    fresh = await greedy(engine, (1, 2), 3)
    assert fresh.weight_spans == ((0, 3, "default"),)


async def test_weight_version_and_flush_cache(engine: EmbeddedEngine) -> None:
    assert await engine.flush_cache()
    engine.weight_version = "step-3"
    try:
        r = await greedy(engine, (1, 2), 1)
        assert r.weight_version == "step-3"
        assert r.cached_tokens == 0  # no prefix cache
    finally:
        engine.weight_version = "default"
    slow = asyncio.create_task(greedy(engine, (1, 2), 150))
    await until(lambda: engine.num_running == 1)
    assert not await engine.flush_cache()  # busy, like SGLang's /flush_cache
    await slow
