"""The video_tools MCP server over stdio, loaded from the shipped tool_configs/video.yaml.

The clip is made by the demo's script (PyAV's mpeg4 encoder); frames come back as real
``ImageContent`` PNGs, decoded on our side into ``ToolResult.images``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from toolrollout.apps.demo_vl.video import COLOURS, Segment, make_video
from toolrollout.apps.mcp_servers.video_tools import read_frames
from toolrollout.tools import ToolCallRequest, ToolExecutor, ToolResult, load_tool_config
from toolrollout.tools.mcp import mcp_sessions

REPO = Path(__file__).resolve().parents[2]
SEGMENTS = [
    Segment(0.0, 2.0, "red", 1),
    Segment(2.0, 4.0, "blue", 2),
    Segment(4.0, 6.0, "yellow", 3),
]


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_video(tmp_path_factory.mktemp("video") / "clip.mp4", SEGMENTS, fps=4)


def _near(pixel: tuple[int, ...], colour: str) -> bool:
    return all(abs(a - b) <= 24 for a, b in zip(pixel, COLOURS[colour], strict=True))


def test_read_frames_returns_the_frame_on_screen(clip: Path) -> None:
    frames = read_frames(clip, [0.0, 1.9, 2.0, 3.3, 5.75, 6.5])
    assert [round(t, 2) for t, _ in frames] == [0.0, 1.75, 2.0, 3.25, 5.75]
    colours = ["red", "red", "blue", "blue", "yellow"]
    for (_, image), colour in zip(frames, colours, strict=True):
        assert image.size == (64, 64)
        assert _near(image.getpixel((40, 40)), colour)
    with pytest.raises(ValueError, match=r"cannot open video|no video stream"):
        read_frames(REPO / "pyproject.toml", [0.0])


async def test_crop_video_and_crop_image_over_mcp(clip: Path) -> None:
    tools = load_tool_config(REPO / "tool_configs" / "video.yaml")
    assert sorted(t.name for t in tools) == ["crop_image", "crop_video"]
    async with mcp_sessions(tools):
        executor = ToolExecutor(tools)
        calls = [
            ToolCallRequest(
                "crop_video", {"video_path": str(clip), "start_time": 1, "end_time": 4.5}
            ),
            # 6 s at 4 fps would be 25 frames: the config bounds it to 4, evenly spread.
            ToolCallRequest(
                "crop_video", {"video_path": str(clip), "start_time": 0, "end_time": 5.9, "fps": 4}
            ),
            ToolCallRequest(
                "crop_image",
                {"path": str(clip), "left": 0.5, "top": 0.5, "right": 1, "bottom": 1, "time": 4.2},
            ),
            ToolCallRequest(
                "crop_video", {"video_path": "/nonexistent.mp4", "start_time": 0, "end_time": 1}
            ),
            ToolCallRequest(
                "crop_video", {"video_path": str(clip), "start_time": 3, "end_time": 1}
            ),
            ToolCallRequest(
                "crop_video", {"video_path": str(clip), "start_time": 30, "end_time": 31}
            ),
            ToolCallRequest(
                "crop_image",
                {
                    "path": str(REPO / "pyproject.toml"),
                    "left": 0,
                    "top": 0,
                    "right": 1,
                    "bottom": 1,
                },
            ),
        ]
        results = await executor.run_calls(calls)
    window, bounded, zoom, missing, backwards, past_end, not_media = results
    _frames_are(window, ["red", "blue", "blue", "yellow"], "from 1s to 4.5s")
    assert "t=1.00s" in window.text and "t=4.00s" in window.text
    _frames_are(bounded, ["red", "red", "blue", "yellow"], "4 frame(s)")
    assert not zoom.is_error and len(zoom.images) == 1
    assert zoom.images[0].size == (32, 32) and _near(zoom.images[0].getpixel((10, 10)), "yellow")
    for result, reason in (
        (missing, "no such file"),
        (backwards, "before start_time"),
        (past_end, "no frames between 30"),
        (not_media, "neither an image nor a readable video"),
    ):
        assert result.is_error and not result.images, result
        assert reason in result.text


def _frames_are(result: ToolResult, colours: list[str], caption: str) -> None:
    assert not result.is_error, result.text
    assert caption in result.text
    assert len(result.images) == len(colours)
    for image, colour in zip(result.images, colours, strict=True):
        assert _near(image.convert("RGB").getpixel((40, 40)), colour), (
            image.getpixel((40, 40)),
            colour,
        )
