"""End to end over HTTP with images: `toolrollout serve` with the VL demo model.

The VL demo's language model is the trained text demo, so it calls the calculator; here the
calculator also returns a picture of its result (a real image from a real tool), which must
travel as placeholders in the next turn's ids and as ``image_data`` in its request. Every
trajectory is checked for token fidelity against one teacher-forced forward pass of the
same model WITH the pixel inputs, which only agrees if the server saw the same images at
the same positions.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests._processes import free_port, stop, wait_http

from toolrollout.apps.demo import load_demo_prompts
from toolrollout.apps.demo_vl import DEMO_VL_MODEL_PATH
from toolrollout.chat import VisionFormat
from toolrollout.chat._multimodal import load_image
from toolrollout.engines import SamplingParams, SGLangClient
from toolrollout.rollout import (
    RolloutConfig,
    RolloutRunner,
    Trajectory,
    read_rows,
    verl_multi_modal_data,
    write_trajectories,
)
from toolrollout.tools import ToolResult, function_tool
from toolrollout.tools.calculator import CALCULATOR_TOOL, calculator

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def picture_calculator(expression: str) -> ToolResult:
    """The demo calculator, which also returns its result as a small picture."""
    from PIL import Image, ImageDraw

    text = calculator(expression)
    image = Image.new("RGB", (84, 56), "white")
    ImageDraw.Draw(image).text((4, 20), text[:12], fill="black")
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return ToolResult(text=text, images=(buffer.getvalue(),), is_error=text.startswith("Error"))


@pytest.fixture(scope="module")
def vl_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = (tmp_path_factory.mktemp("serve") / "serve.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "toolrollout",
            "serve",
            "--model",
            str(DEMO_VL_MODEL_PATH),
            "--port",
            str(port),
            "--threads",
            "1",
            "--log-level",
            "warning",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/health", 300, proc)
        yield url
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def vision() -> VisionFormat:
    return VisionFormat.from_pretrained(DEMO_VL_MODEL_PATH)


@pytest.fixture(scope="module")
def trajectories(vl_server: str, vision: VisionFormat) -> list[Trajectory]:
    import anyio
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(DEMO_VL_MODEL_PATH))
    tool = function_tool(name="calculator")(picture_calculator).with_schema(CALCULATOR_TOOL)
    config = RolloutConfig(
        sampling=SamplingParams(max_new_tokens=64, temperature=1.0), max_turns=3, seed=7
    )

    async def main() -> list[Trajectory]:
        async with SGLangClient(vl_server) as client:
            await client.wait_healthy(timeout=60)
            info = await client.model_info()
            assert info.get("has_image_understanding") is True
            runner = RolloutRunner(client, tokenizer, [tool], config=config, vision=vision)
            return await runner.run(load_demo_prompts()[:4])

    return anyio.run(main)


def test_images_went_through_the_server(
    trajectories: list[Trajectory], vision: VisionFormat
) -> None:
    with_images = [t for t in trajectories if t.images]
    assert len(with_images) >= 3, [(t.status, t.error, t.num_tool_calls) for t in trajectories]
    for t in trajectories:
        assert t.status in ("completed", "truncated"), t.error
        assert t.metrics["drift_mismatches"] == 0
        sequence = list(t.prompt_ids) + t.response_ids
        assert sequence.count(vision.pad_id) == sum(i.num_tokens for i in t.images)
        for image in t.images:
            assert image.num_tokens == vision.prepare(image.png).num_tokens
            assert set(sequence[image.start : image.end]) == {vision.pad_id}
            assert sequence[image.start - 1] == vision.start_id
            assert sequence[image.end] == vision.end_id
        tool_texts = [m["content"] for m in t.messages if m["role"] == "tool"]
        assert len(tool_texts) == len(t.images)


def test_logprobs_match_teacher_forcing_with_pixels(
    trajectories: list[Trajectory], vision: VisionFormat
) -> None:
    import torch
    from transformers import AutoImageProcessor, AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(
        str(DEMO_VL_MODEL_PATH), dtype=torch.float32
    ).eval()  # type: ignore[no-untyped-call]
    processor = AutoImageProcessor.from_pretrained(  # type: ignore[no-untyped-call]
        str(DEMO_VL_MODEL_PATH), backend="pil"
    )
    checked = 0
    for t in [t for t in trajectories if t.images][:3]:
        ids = list(t.prompt_ids) + t.response_ids
        inputs = processor(images=[load_image(i.png) for i in t.images])
        full = torch.tensor([ids])
        with torch.no_grad():
            logits = (
                model(
                    input_ids=full,
                    pixel_values=torch.as_tensor(inputs["pixel_values"]),
                    image_grid_thw=torch.as_tensor(inputs["image_grid_thw"]),
                    mm_token_type_ids=(full == vision.pad_id).int(),
                )
                .logits[0]
                .float()
            )
        logprobs = torch.log_softmax(logits, dim=-1)
        start = len(t.prompt_ids)
        for i, (mask, engine_lp) in enumerate(zip(t.loss_mask, t.rollout_logprobs, strict=True)):
            if mask == 1 and start + i > t.images[0].end:  # turns that saw an image
                forced = logprobs[start + i - 1, ids[start + i]].item()
                assert abs(forced - engine_lp) < 1e-4, (t.uid, i, forced, engine_lp)
                checked += 1
    assert checked > 10


def test_parquet_keeps_what_a_trainer_needs(trajectories: list[Trajectory], tmp_path: Path) -> None:
    rows = read_rows(write_trajectories(trajectories, tmp_path / "vl.parquet"))
    for row, t in zip(rows, trajectories, strict=True):
        assert row["images"] == [i.png for i in t.images]
        assert [(s["start"], s["end"]) for s in row["image_spans"]] == [
            (i.start, i.end) for i in t.images
        ]
        images: list[Any] = verl_multi_modal_data(row)["images"]
        assert [im.size for im in images] == [(84, 56)] * len(t.images)


def test_the_server_refuses_bad_image_data(vl_server: str) -> None:
    import httpx
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(DEMO_VL_MODEL_PATH))
    ids = tokenizer.encode("<|vision_start|><|image_pad|><|vision_end|>hi")
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 2}}
    for images, reason in (
        (["data:image/png;base64,AAAA"], "not a readable image"),
        ([], None),
    ):
        r = httpx.post(f"{vl_server}/generate", json={**body, "image_data": images}, timeout=60)
        if reason is None:  # no images: the pad is plain text to the model, like SGLang
            assert r.status_code == 200
        else:
            assert r.status_code == 400 and reason in r.json()["error"]["message"]
