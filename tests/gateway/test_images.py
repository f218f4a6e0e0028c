"""Images in harness requests, through the same multimodal path the rollout loop uses.

Chat Completions ``image_url`` parts (data URLs), Responses ``input_image`` and Anthropic
``image`` blocks (base64) are prepared with the model's image processor, their placeholders
expanded in the transcript (one run per image, as many ids as the image's grid gives), sent
to the engine as ``image_data`` with one placeholder each, and recorded in the row's
``images`` with their spans, as ``generate`` records a tool's images. The VL demo's
tokenizer and image processor are used with a scripted engine; the last test runs the VL
demo model itself.
"""

from __future__ import annotations

import base64
import io
from typing import Any

import anthropic
import openai
import pytest
from PIL import Image

from toolrollout.apps.demo_vl import DEMO_VL_MODEL_PATH
from toolrollout.apps.gateway import ChatRequest, Gateway, GatewayConfig
from toolrollout.chat import VisionFormat
from toolrollout.spec._policy import load_tokenizer

from .conftest import Model, served


def png(colour: str, size: tuple[int, int] = (64, 64)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="PNG")
    return buffer.getvalue()


def data_url(colour: str) -> str:
    return "data:image/png;base64," + base64.b64encode(png(colour)).decode("ascii")


@pytest.fixture(scope="module")
def vl() -> tuple[Any, VisionFormat]:
    return load_tokenizer(DEMO_VL_MODEL_PATH), VisionFormat.from_pretrained(DEMO_VL_MODEL_PATH)


def look(colour: str, text: str = "What colour is this?") -> Any:
    return {
        "role": "user",
        "content": [
            {"type": "image_url", "image_url": {"url": data_url(colour)}},
            {"type": "text", "text": text},
        ],
    }


async def test_chat_images_are_expanded_sent_and_recorded(vl: tuple[Any, VisionFormat]) -> None:
    tokenizer, vision = vl
    model = Model(tokenizer, ["Red.", "Blue."])
    model.engine.vision = True
    async with served(model, vision=vision) as (url, gateway):
        client = openai.AsyncOpenAI(
            base_url=f"{url}/v1",
            api_key="harness-key",
            default_headers={"X-Toolrollout-Session": "s1"},
            max_retries=0,
        )
        messages: list[Any] = [look("red")]
        first = await client.chat.completions.create(model="m", messages=messages)
        messages += [
            first.choices[0].message.model_dump(exclude_none=True),
            look("blue", "And this one?"),
        ]
        second = await client.chat.completions.create(model="m", messages=messages)
        (row,) = gateway.close_session("s1")
    assert (first.choices[0].message.content, second.choices[0].message.content) == (
        "Red.",
        "Blue.",
    )
    assert row.metrics["gateway"]["requests"] == 2  # the second image extended the segment
    one, two = model.engine.requests
    assert one.image_data is not None and two.image_data is not None
    assert len(one.image_data) == 1 and len(two.image_data) == 2  # every image so far
    assert two.image_data[0] == one.image_data[0]
    for request in (one, two):  # one placeholder per image on the wire
        assert list(request.input_ids).count(vision.pad_id) == len(request.image_data or ())
    ids = [*row.prompt_ids, *row.response_ids]
    expected = vision.prepare(data_url("red")).num_tokens
    assert [image.end - image.start for image in row.images] == [expected] * 2
    assert row.images[0].end <= len(row.prompt_ids) < row.images[1].start  # prompt, then delta
    for image in row.images:
        assert set(ids[image.start : image.end]) == {vision.pad_id}
    assert [i for i, t in enumerate(ids) if t == vision.pad_id] == [
        i for image in row.images for i in range(image.start, image.end)
    ]
    assert row.images[0].to_pil().getpixel((0, 0)) == (255, 0, 0)
    assert row.images[1].to_pil().getpixel((0, 0)) == (0, 0, 255)
    # The transcript is the conversation rendered once, placeholders expanded.
    chat = gateway.chat_format(())
    fresh = chat.render_prompt([dict(m) for m in row.messages[:-1]])
    assert vision.collapse(ids)[: len(fresh)] == fresh
    assert row.messages[0]["content"][0] == {"type": "image"}  # pixels are in row.images
    assert row.to_row()["image_spans"] == [{"start": i.start, "end": i.end} for i in row.images]


async def test_responses_and_anthropic_images_take_the_same_path(
    vl: tuple[Any, VisionFormat],
) -> None:
    tokenizer, vision = vl
    model = Model(tokenizer, ["Green.", "Green."])
    model.engine.vision = True
    async with served(model, vision=vision) as (url, gateway):
        oa = openai.AsyncOpenAI(
            base_url=f"{url}/v1",
            api_key="harness-key",
            default_headers={"X-Toolrollout-Session": "r"},
            max_retries=0,
        )
        reply = await oa.responses.create(
            model="m",
            input=[
                {
                    "role": "user",
                    "content": [
                        {"type": "input_image", "image_url": data_url("green"), "detail": "auto"},
                        {"type": "input_text", "text": "Colour?"},
                    ],
                }
            ],
        )
        an = anthropic.AsyncAnthropic(
            base_url=url,
            api_key="harness-key",
            default_headers={"X-Toolrollout-Session": "a"},
            max_retries=0,
        )
        image = base64.b64encode(png("green")).decode("ascii")
        asked: Any = [
            {
                "role": "user",
                "content": [
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": image},
                    },
                    {"type": "text", "text": "Colour?"},
                ],
            }
        ]
        message = await an.messages.create(model="m", max_tokens=16, messages=asked)
        counted = await an.messages.count_tokens(model="m", messages=asked)
        rows = [gateway.close_session("r")[0], gateway.close_session("a")[0]]
    assert counted.input_tokens == len(rows[1].prompt_ids)  # placeholders expanded
    assert reply.output_text == "Green." and message.content[0].text == "Green."  # type: ignore[union-attr]
    for row in rows:
        (recorded,) = row.images
        assert recorded.to_pil().getpixel((0, 0)) == (0, 128, 0)
    assert [len(r.image_data or ()) for r in model.engine.requests] == [1, 1]


async def test_images_are_refused_for_a_text_model_and_as_urls(
    demo_tokenizer: Any, vl: tuple[Any, VisionFormat]
) -> None:
    model = Model(demo_tokenizer, ["unused"])
    async with served(model) as (url, _):
        client = openai.AsyncOpenAI(
            base_url=f"{url}/v1",
            api_key="harness-key",
            default_headers={"X-Toolrollout-Session": "s1"},
            max_retries=0,
        )
        with pytest.raises(openai.BadRequestError) as text_only:
            await client.chat.completions.create(model="m", messages=[look("red")])
        an = anthropic.AsyncAnthropic(
            base_url=url,
            api_key="harness-key",
            default_headers={"X-Toolrollout-Session": "a"},
            max_retries=0,
        )
        with pytest.raises(anthropic.BadRequestError) as refused:
            await an.messages.create(
                model="m",
                max_tokens=8,
                messages=[
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image",
                                "source": {
                                    "type": "base64",
                                    "media_type": "image/png",
                                    "data": "x",
                                },
                            }
                        ],
                    }
                ],
            )
    assert "takes no images" in text_only.value.message
    assert "takes no images" in str(refused.value)
    assert not model.engine.requests
    tokenizer, vision = vl
    vl_model = Model(tokenizer, ["unused"])
    async with served(vl_model, vision=vision) as (url, _):
        client = openai.AsyncOpenAI(
            base_url=f"{url}/v1",
            api_key="harness-key",
            default_headers={"X-Toolrollout-Session": "s1"},
            max_retries=0,
        )
        remote: Any = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
        with pytest.raises(openai.BadRequestError) as fetched:
            await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": [remote]}]
            )
        broken: Any = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
        with pytest.raises(openai.BadRequestError) as unreadable:
            await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": [broken]}]
            )
    assert "image URLs are not fetched" in fetched.value.message
    assert "messages[0].content[0]" in fetched.value.message
    assert "image 1 of the request" in unreadable.value.message
    assert not vl_model.engine.requests


@pytest.mark.slow
async def test_the_vl_demo_model_answers_an_image_through_the_gateway(
    vl: tuple[Any, VisionFormat],
) -> None:
    from toolrollout.engines.embedded import EmbeddedEngine

    tokenizer, vision = vl
    async with EmbeddedEngine(DEMO_VL_MODEL_PATH, num_threads=1) as engine:
        config = GatewayConfig(default_max_tokens=16, idle_timeout=None)
        async with Gateway(engine, tokenizer, config=config, vision=vision) as gateway:
            result = await gateway.complete(
                ChatRequest(session="s", messages=(look("red"),), temperature=0.0)
            )
            (row,) = gateway.close_session("s")
    assert result.completion_tokens > 0
    (image,) = row.images
    assert image.end - image.start == vision.prepare(data_url("red")).num_tokens
    assert all(lp < 0 for lp in row.spans[0].logprobs)
