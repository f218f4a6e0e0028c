"""VisionFormat: placeholder counts and expansion agree with the Hugging Face processor."""

from __future__ import annotations

import base64
import io
from types import SimpleNamespace
from typing import Any

import pytest

from toolrollout.apps.demo_vl import DEMO_VL_MODEL_PATH
from toolrollout.chat import ChatFormat, VisionFormat
from toolrollout.chat._multimodal import load_image
from toolrollout.exceptions import ImageError

SIZES = [(90, 60), (56, 56), (200, 30), (20, 20), (300, 300), (113, 87)]


@pytest.fixture(scope="module")
def parts() -> tuple[Any, Any, VisionFormat]:
    from transformers import AutoImageProcessor, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(DEMO_VL_MODEL_PATH))
    processor = AutoImageProcessor.from_pretrained(  # type: ignore[no-untyped-call]
        str(DEMO_VL_MODEL_PATH), backend="pil"
    )
    return tokenizer, processor, VisionFormat(tokenizer, processor)


def _image(size: tuple[int, int], colour: str = "red") -> Any:
    from PIL import Image

    return Image.new("RGB", size, colour)


@pytest.mark.parametrize("size", SIZES)
def test_token_count_equals_the_processors(
    parts: tuple[Any, Any, VisionFormat], size: tuple[int, int]
) -> None:
    _, processor, vision = parts
    original = _image(size)
    prepared = vision.prepare(original)
    # The processor on the ORIGINAL image: our resize must land on the grid it computes.
    grid = processor(images=[original])["image_grid_thw"][0]
    assert prepared.grid_thw == tuple(int(x) for x in grid)
    assert prepared.num_tokens == int(grid.prod()) // processor.merge_size**2
    # ...and the prepared image is a fixed point: the processor does not resize it again.
    again = processor(images=[load_image(prepared.png)])["image_grid_thw"][0]
    assert tuple(int(x) for x in again) == prepared.grid_thw
    assert prepared.width % vision.factor == 0 and prepared.height % vision.factor == 0


def test_expansion_matches_the_processors_text_expansion(
    parts: tuple[Any, Any, VisionFormat],
) -> None:
    """Qwen2VLProcessor repeats <|image_pad|> in the text, then tokenizes; we expand ids."""
    from transformers import Qwen2VLProcessor

    tokenizer, processor, vision = parts
    chat = ChatFormat(tokenizer)
    images = [_image((90, 60)), _image((200, 30), "blue")]
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "look"}]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "and this"}]},
    ]
    text = chat.render_text(messages, add_generation_prompt=True)
    inputs = processor(images=images)
    # The processor's own expansion rule (the full processor needs torchvision for its
    # video half, so its per-image method is called with just the image processor).
    fake = SimpleNamespace(image_processor=processor, image_token="<|image_pad|>")
    pieces = text.split("<|image_pad|>")
    assert len(pieces) == len(images) + 1
    expanded_text = pieces[0]
    for index, piece in enumerate(pieces[1:]):
        pads = Qwen2VLProcessor.replace_image_token(fake, inputs, index)  # type: ignore[arg-type]
        expanded_text += pads + piece
    reference = tokenizer.encode(expanded_text, add_special_tokens=False)

    prepared = [vision.prepare(image) for image in images]
    ids, runs = vision.expand(chat.encode(text), [p.num_tokens for p in prepared])
    assert ids == reference
    assert [run.num_tokens for run in runs] == [p.num_tokens for p in prepared]
    assert all(set(ids[r.start : r.end]) == {vision.pad_id} for r in runs)
    assert ids[runs[0].start - 1] == vision.start_id and ids[runs[0].end] == vision.end_id
    assert vision.runs(ids) == runs
    assert vision.collapse(ids) == chat.encode(text)


def test_expand_rejects_a_count_mismatch(parts: tuple[Any, Any, VisionFormat]) -> None:
    tokenizer, _, vision = parts
    ids = tokenizer.encode("a<|vision_start|><|image_pad|><|vision_end|>b")
    with pytest.raises(ImageError, match="1 image placeholders for 2 images"):
        vision.expand(ids, [4, 4])
    with pytest.raises(ImageError, match="more image placeholders"):
        vision.expand(ids, [])
    with pytest.raises(ImageError, match="outside"):
        vision.expand(tokenizer.encode("a<|image_pad|>b"), [4])


def test_load_image_forms_and_failures(tmp_path: Any) -> None:
    buffer = io.BytesIO()
    _image((10, 8), "green").save(buffer, format="PNG")
    png = buffer.getvalue()
    encoded = base64.b64encode(png).decode()
    path = tmp_path / "x.png"
    path.write_bytes(png)
    for form in (png, encoded, "data:image/png;base64," + encoded, str(path), _image((10, 8))):
        image = load_image(form)
        assert image.size == (10, 8) and image.mode == "RGB"
    with pytest.raises(ImageError, match="not a readable image"):
        load_image(b"\x89PNG but not really")
    with pytest.raises(ImageError, match="neither base64 nor an existing file"):
        load_image("not base64 !!")
    with pytest.raises(ImageError, match="cannot read an image from a int"):
        load_image(3)
    for empty in ("", "  ", "data:image/png;base64,"):
        with pytest.raises(ImageError, match="0 bytes of image data"):
            load_image(empty)


def test_a_text_tokenizer_is_refused() -> None:
    from transformers import AutoImageProcessor, AutoTokenizer

    from toolrollout.apps.demo import DEMO_MODEL_PATH
    from toolrollout.exceptions import ConfigError

    processor = AutoImageProcessor.from_pretrained(  # type: ignore[no-untyped-call]
        str(DEMO_VL_MODEL_PATH), backend="pil"
    )
    with pytest.raises(ConfigError, match="not a Qwen2-VL model"):
        VisionFormat(AutoTokenizer.from_pretrained(str(DEMO_MODEL_PATH)), processor)
