"""How `toolrollout serve` groups `image_data` per request, as SGLang's normalisation does."""

from __future__ import annotations

import pytest

from toolrollout.apps.server._protocol import BadRequest, parse_generate


def _parse(body: dict[str, object]) -> list[tuple[object, ...] | None]:
    parsed = parse_generate(body, tokenize=lambda text: [1, 2], context_length=64)
    return [sub.request.image_data for sub in parsed.subs]


def test_one_request_takes_all_its_images() -> None:
    assert _parse({"input_ids": [1, 2], "image_data": "a.png"}) == [("a.png",)]
    assert _parse({"input_ids": [1, 2], "image_data": ["a.png", "b.png"]}) == [("a.png", "b.png")]
    assert _parse({"input_ids": [1, 2], "image_data": [["a.png", "b.png"]]}) == [("a.png", "b.png")]
    assert _parse({"input_ids": [1, 2]}) == [None]


def test_a_batch_has_one_entry_per_item() -> None:
    body = {"input_ids": [[1, 2], [3, 4], [5]], "image_data": [["a.png", "b.png"], None, "c.png"]}
    assert _parse(body) == [("a.png", "b.png"), None, ("c.png",)]
    # n > 1: every sample of an item gets that item's images.
    body = {
        "input_ids": [[1, 2], [3]],
        "image_data": [[], ["x.png"]],
        "sampling_params": {"n": 2, "max_new_tokens": 1},
    }
    assert _parse(body) == [None, None, ("x.png",), ("x.png",)]
    with pytest.raises(BadRequest, match="one entry per batch item"):
        _parse({"input_ids": [[1], [2]], "image_data": ["only-one.png"]})
