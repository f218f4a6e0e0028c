"""Images from tools through the rollout loop (scripted engine, real tokenizer and tools).

Checks: the next request carries the images as ``image_data`` data URLs; the transcript
holds exactly the processor's placeholder count per image, at the recorded spans; the drift
check still matches; budgets leave whole images out; unreadable images become tool errors;
images round-trip through parquet and JSONL into the trainer views.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import pytest

from toolrollout.apps.demo_vl import DEMO_VL_MODEL_PATH
from toolrollout.chat import VisionFormat
from toolrollout.rollout import (
    RolloutConfig,
    RolloutRunner,
    Trajectory,
    TrajectoryStatus,
    read_rows,
    swift_row,
    trl_messages,
    verl_multi_modal_data,
    write_trajectories,
)
from toolrollout.testing import ScriptedEngine, ScriptedOutput
from toolrollout.tools import ToolResult, function_tool

PROMPT = [{"role": "user", "content": "Which colours are in the clip?"}]
CALL = '<tool_call>\n{{"name": "frames", "arguments": {args}}}\n</tool_call><|im_end|>'
COLOURS = ["red", "green", "blue", "yellow"]


def _png(colour: str, size: tuple[int, int]) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="PNG")
    return buffer.getvalue()


def frames(count: int, corrupt: bool = False) -> ToolResult:
    """Return `count` frames of different colours and sizes."""
    images: list[Any] = [_png(COLOURS[i % 4], (90 + 28 * i, 60)) for i in range(count)]
    if corrupt:
        images[-1] = b"\x89PNG\r\n\x1a\n broken"
    return ToolResult(text=f"{count} frames", images=tuple(images))


@pytest.fixture(scope="module")
def vl_tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(DEMO_VL_MODEL_PATH))


@pytest.fixture(scope="module")
def vision() -> VisionFormat:
    return VisionFormat.from_pretrained(DEMO_VL_MODEL_PATH)


def _engine(tokenizer: Any, *calls: dict[str, Any]) -> ScriptedEngine:
    texts = [CALL.format(args=json.dumps(c)) for c in calls] + ["They are red.<|im_end|>"]
    steps = []
    for text in texts:
        out = tokenizer.encode(text, add_special_tokens=False)
        steps.append(ScriptedOutput(out, logprobs=[-0.25] * len(out)))
    return ScriptedEngine(steps)


async def _run(
    tokenizer: Any, vision: VisionFormat | None, *calls: dict[str, Any], **config: Any
) -> tuple[Trajectory, ScriptedEngine]:
    engine = _engine(tokenizer, *calls)
    runner = RolloutRunner(
        engine,
        tokenizer,
        [function_tool(frames)],
        config=RolloutConfig(**config),
        vision=vision,
    )
    [trajectory] = await runner.run([PROMPT])
    return trajectory, engine


def _check_spans(trajectory: Trajectory, vision: VisionFormat) -> None:
    sequence = list(trajectory.prompt_ids) + trajectory.response_ids
    runs = vision.runs(sequence)
    assert [(r.start, r.end) for r in runs] == [(i.start, i.end) for i in trajectory.images]
    for image in trajectory.images:
        assert set(
            trajectory.loss_mask[
                image.start - len(trajectory.prompt_ids) : image.end - len(trajectory.prompt_ids)
            ]
        ) == {0}
    # No orphan placeholders: every pad belongs to a recorded image.
    assert sequence.count(vision.pad_id) == sum(i.num_tokens for i in trajectory.images)


async def test_tool_images_reach_the_next_turn(vl_tokenizer: Any, vision: VisionFormat) -> None:
    trajectory, engine = await _run(vl_tokenizer, vision, {"count": 2}, {"count": 1})
    assert trajectory.status is TrajectoryStatus.COMPLETED, trajectory.error
    assert len(trajectory.images) == 3
    expected = [vision.prepare(_png(COLOURS[i % 4], (90 + 28 * i, 60))) for i in (0, 1, 0)]
    assert [i.num_tokens for i in trajectory.images] == [p.num_tokens for p in expected]
    assert [i.png for i in trajectory.images] == [p.png for p in expected]
    _check_spans(trajectory, vision)
    # Each request carries every image so far, as data URLs SGLang accepts, and its ids
    # hold exactly that many placeholder runs.
    sent = [r.image_data or () for r in engine.requests]
    assert [len(s) for s in sent] == [0, 2, 3]
    assert all(url.startswith("data:image/png;base64,") for url in sent[2])
    assert base64.b64decode(sent[2][2].partition(",")[2]) == expected[2].png
    # The ids on the wire hold one placeholder per image (SGLang expands it); the
    # transcript holds the expansion.
    transcript = list(trajectory.prompt_ids) + trajectory.response_ids
    for request in engine.requests:
        runs = vision.runs(request.input_ids)
        assert len(runs) == len(request.image_data or ())
        assert all(run.num_tokens == 1 for run in runs)
        counts = [image.num_tokens for image in trajectory.images[: len(runs)]]
        expanded, _ = vision.expand(list(request.input_ids), counts)
        assert expanded == transcript[: len(expanded)]
    assert trajectory.metrics["drift_mismatches"] == 0
    assert trajectory.metrics["images"] == 3
    tool = next(m for m in trajectory.messages if m["role"] == "tool")
    assert tool["content"] == [
        {"type": "image"},
        {"type": "image"},
        {"type": "text", "text": "2 frames"},
    ]


async def test_budgets_leave_out_whole_images(vl_tokenizer: Any, vision: VisionFormat) -> None:
    trajectory, engine = await _run(vl_tokenizer, vision, {"count": 3}, {"count": 2}, max_images=2)
    assert len(trajectory.images) == 2
    _check_spans(trajectory, vision)
    assert trajectory.metrics["images_dropped"] == 3
    tools = [m for m in trajectory.messages if m["role"] == "tool"]
    assert "1 image(s) left out" in tools[0]["content"][-1]["text"]
    assert "2 image(s) left out" in tools[1]["content"]
    assert len(engine.requests[-1].image_data or ()) == 2

    first = vision.prepare(_png("red", (90, 60))).num_tokens
    trajectory, _ = await _run(vl_tokenizer, vision, {"count": 3}, max_image_tokens=first + 1)
    assert len(trajectory.images) == 1 and trajectory.images[0].num_tokens == first
    _check_spans(trajectory, vision)


async def test_an_unreadable_image_is_a_tool_error(vl_tokenizer: Any, vision: VisionFormat) -> None:
    trajectory, engine = await _run(vl_tokenizer, vision, {"count": 2, "corrupt": True})
    assert trajectory.status is TrajectoryStatus.COMPLETED
    assert trajectory.tool_errors == 1 and trajectory.images == ()
    tool = next(m for m in trajectory.messages if m["role"] == "tool")
    assert tool["content"].startswith("Error: the tool returned an unreadable image")
    assert vision.pad_id not in trajectory.response_ids
    assert all(not r.image_data for r in engine.requests)


async def test_a_text_model_is_told_images_were_left_out(vl_tokenizer: Any) -> None:
    trajectory, engine = await _run(vl_tokenizer, None, {"count": 2})
    assert trajectory.images == ()
    tool = next(m for m in trajectory.messages if m["role"] == "tool")
    assert "2 image(s) not shown" in tool["content"]
    assert all(not r.image_data for r in engine.requests)


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
async def test_images_round_trip_into_trainer_views(
    vl_tokenizer: Any, vision: VisionFormat, tmp_path: Path, suffix: str
) -> None:
    trajectory, _ = await _run(vl_tokenizer, vision, {"count": 2})
    path = write_trajectories([trajectory], tmp_path / f"out{suffix}")
    [row] = read_rows(path)
    assert row["images"] == [i.png for i in trajectory.images]
    assert [(s["start"], s["end"]) for s in row["image_spans"]] == [
        (i.start, i.end) for i in trajectory.images
    ]
    sequence = row["prompt_ids"] + row["response_ids"]
    for span in row["image_spans"]:
        assert set(sequence[span["start"] : span["end"]]) == {vision.pad_id}
    for source in (trajectory, row):
        images = verl_multi_modal_data(source)["images"]
        assert [im.size for im in images] == [(84, 56), (112, 56)]
        assert images[1].getpixel((5, 5)) == (0, 128, 0)  # PIL's "green"
        trl = trl_messages(source)
        tool = next(m for m in trl if m["role"] == "tool")
        assert [p["type"] for p in tool["content"]] == ["image", "image", "text"]
        assert tool["content"][0]["image"].size == (84, 56)
        swift = swift_row(source)
        assert len(swift["images"]) == 2
        tool_text = next(m for m in swift["messages"] if m["role"] == "tool")["content"]
        assert tool_text == "<image><image>2 frames"


async def test_image_preparation_does_not_stall_other_trajectories(
    vl_tokenizer: Any, vision: VisionFormat
) -> None:
    """One trajectory's slow image preparation runs in a thread; another finishes meanwhile."""
    import time

    prepared_at: list[float] = []

    class SlowVision(VisionFormat):
        __slots__ = ()

        def prepare(self, data: Any) -> Any:
            time.sleep(1.5)  # blocking, as decoding a large frame is
            prepared_at.append(time.monotonic())
            return super().prepare(data)

    slow = SlowVision.from_pretrained(DEMO_VL_MODEL_PATH)

    def answer(request: Any) -> ScriptedOutput:
        text = vl_tokenizer.decode(list(request.input_ids))
        if "<tool_response>" in text:
            reply = "Done.<|im_end|>"
        else:
            count = 1 if "slow" in text else 0
            reply = CALL.format(args=json.dumps({"count": count}))
        ids = vl_tokenizer.encode(reply, add_special_tokens=False)
        return ScriptedOutput(ids, logprobs=[-0.1] * len(ids))

    finished: dict[str, float] = {}
    runner = RolloutRunner(
        ScriptedEngine(answer), vl_tokenizer, [function_tool(frames)], vision=slow
    )
    prompts = [
        [{"role": "user", "content": "slow one"}],
        [{"role": "user", "content": "quick one"}],
    ]

    def record(t: Trajectory) -> None:
        finished.setdefault(str(t.prompt_index), time.monotonic())

    results = await runner.run(prompts, on_result=record)
    assert [len(t.images) for t in results] == [1, 0]
    assert finished["1"] < prepared_at[0] < finished["0"]
