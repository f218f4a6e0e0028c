"""The embedded engine with images: the VL demo model against a plain HF forward pass.

The reference is one ``Qwen2VLForConditionalGeneration`` forward over prompt + output with
the processor's pixel inputs, where transformers computes the 3-D rotary positions itself.
Equal logprobs prove that the engine's prefill (vision features, mRoPE positions) and its
batched decode (position offset after the images) are right.
"""

from __future__ import annotations

import asyncio
import base64
import io
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from tests._serve_thread import serve_in_thread

from toolrollout._exceptions import EngineRequestRejected
from toolrollout.apps.demo_vl import DEMO_VL_MODEL_PATH
from toolrollout.chat import VisionFormat
from toolrollout.chat._multimodal import load_image
from toolrollout.engines import SGLangClient
from toolrollout.engines._types import GenerateRequest, SamplingParams
from toolrollout.engines.embedded import EmbeddedEngine

PROMPT = [
    {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is 2+3?"}]},
]


@pytest.fixture(scope="module")
def engine() -> Iterator[EmbeddedEngine]:
    eng = EmbeddedEngine(DEMO_VL_MODEL_PATH, max_batch_size=8, num_threads=1)
    asyncio.run(eng.start())
    yield eng
    asyncio.run(eng.aclose())


@pytest.fixture(scope="module")
def vision() -> VisionFormat:
    return VisionFormat.from_pretrained(DEMO_VL_MODEL_PATH)


@pytest.fixture(scope="module")
def reference() -> Any:
    from transformers import AutoImageProcessor, AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(
        str(DEMO_VL_MODEL_PATH), dtype=torch.float32
    ).eval()  # type: ignore[no-untyped-call]
    processor = AutoImageProcessor.from_pretrained(  # type: ignore[no-untyped-call]
        str(DEMO_VL_MODEL_PATH), backend="pil"
    )
    return model, processor


def _png(colour: str, size: tuple[int, int] = (90, 60)) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="PNG")
    return buffer.getvalue()


def _prompt(engine: EmbeddedEngine, messages: list[dict[str, Any]] = PROMPT) -> tuple[int, ...]:
    text = engine.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    return tuple(engine.tokenizer.encode(text))


def _greedy(ids: tuple[int, ...], images: tuple[Any, ...] | None, n: int = 6) -> GenerateRequest:
    return GenerateRequest(
        input_ids=ids,
        sampling=SamplingParams(max_new_tokens=n, temperature=0, ignore_eos=True),
        image_data=images,
    )


def _reference_logprobs(
    reference: Any,
    vision: VisionFormat,
    prompt: list[int],
    output: tuple[int, ...],
    pngs: list[bytes],
) -> list[float]:
    model, processor = reference
    prepared = [vision.prepare(png) for png in pngs]
    ids, _ = vision.expand(prompt, [p.num_tokens for p in prepared])
    inputs = processor(images=[load_image(p.png) for p in prepared])
    full = torch.tensor([ids + list(output[:-1])])
    types = (full == vision.pad_id).int()
    with torch.no_grad():
        logits = model(
            input_ids=full,
            pixel_values=torch.as_tensor(inputs["pixel_values"]),
            image_grid_thw=torch.as_tensor(inputs["image_grid_thw"]),
            mm_token_type_ids=types,
        ).logits[0]
    logprobs = torch.log_softmax(logits[len(ids) - 1 :].float(), dim=-1)
    return [float(logprobs[i, t]) for i, t in enumerate(output)]


async def test_logprobs_match_a_plain_forward_with_pixels(
    engine: EmbeddedEngine, vision: VisionFormat, reference: Any
) -> None:
    two: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "a"}]},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is 2+3?"}]},
    ]
    ids = _prompt(engine, two)
    pngs = [_png("red"), _png("blue", (200, 40))]
    # Batched with a text-only request, so the decode step mixes offsets.
    text_ids = tuple(engine.tokenize("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"))
    result, _ = await asyncio.gather(
        engine.generate(_greedy(ids, tuple(pngs), n=8)),
        engine.generate(_greedy(text_ids, None, n=8)),
    )
    expected = _reference_logprobs(reference, vision, list(ids), result.output_ids, pngs)
    assert result.output_logprobs is not None
    assert result.output_logprobs == pytest.approx(expected, abs=1e-4)
    placeholders = sum(vision.prepare(p).num_tokens for p in pngs)
    assert result.prompt_tokens == len(ids) - 2 + placeholders


async def test_images_change_the_logits(engine: EmbeddedEngine) -> None:
    ids = _prompt(engine)
    red = await engine.generate(_greedy(ids, (_png("red"),)))
    blue = await engine.generate(_greedy(ids, (_png("blue"),)))
    again = await engine.generate(_greedy(ids, (_png("red"),)))
    assert red.output_logprobs == again.output_logprobs
    assert red.output_logprobs != blue.output_logprobs


async def test_expanded_and_unexpanded_ids_are_the_same_request(
    engine: EmbeddedEngine, vision: VisionFormat
) -> None:
    """Like SGLang: placeholder runs are collapsed and re-expanded from the image."""
    ids = _prompt(engine)
    png = _png("green", (113, 87))
    prepared = vision.prepare(png)
    expanded, _ = vision.expand(list(ids), [prepared.num_tokens])
    forms = [png, base64.b64encode(png).decode(), prepared.data_url]
    plain = await engine.generate(_greedy(ids, (forms[0],)))
    for form in forms[1:]:
        other = await engine.generate(_greedy(tuple(expanded), (form,)))
        assert other.output_ids == plain.output_ids
        assert other.output_logprobs == plain.output_logprobs
        assert other.prompt_tokens == plain.prompt_tokens == len(expanded)


async def test_bad_image_requests_are_rejected(engine: EmbeddedEngine) -> None:
    ids = _prompt(engine)
    with pytest.raises(EngineRequestRejected, match="1 image placeholder run"):
        await engine.generate(_greedy(ids, (_png("red"), _png("blue"))))
    with pytest.raises(EngineRequestRejected, match="not a readable image"):
        await engine.generate(_greedy(ids, (b"\x89PNG broken",)))
    text_only = tuple(engine.tokenize("hello"))
    with pytest.raises(EngineRequestRejected, match="0 image placeholder run"):
        await engine.generate(_greedy(text_only, (_png("red"),)))
    assert engine.num_active == 0


async def test_info_says_the_model_takes_images(engine: EmbeddedEngine) -> None:
    assert (await engine.info()).vision is True
    with serve_in_thread(engine) as url:
        async with SGLangClient(url) as client:  # /model_info's has_image_understanding
            info = await client.info()
    assert info.vision is True
    assert info.model_path == str(DEMO_VL_MODEL_PATH)
