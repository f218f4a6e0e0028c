"""Video tools as an MCP server, in the spirit of LongVT: look at a time window, zoom in.

Run it with ``python -m toolrollout.apps.mcp_servers.video_tools [--transport ...] [--port ...]``;
docs/multimodal.md describes ``crop_video``, ``crop_image`` and their settings. Every
failure (missing file, empty window, undecodable stream) is an ``isError`` result with a
one-line reason, never an empty success.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, cast

from mcp.server.mcpserver import Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from ._cli import serve

__all__ = ["build_server", "main", "read_frames"]

_DEFAULT_MAX_FRAMES = 8
_MAX_SIDE = 448
"""Frames larger than this (either side) are scaled down before encoding."""


def _max_frames() -> int:
    raw = os.environ.get("TOOLROLLOUT_VIDEO_MAX_FRAMES", "")
    try:
        value = int(raw) if raw else _DEFAULT_MAX_FRAMES
    except ValueError:
        value = _DEFAULT_MAX_FRAMES
    return max(1, value)


def _resolve(path: str) -> Path:
    target = Path(path).expanduser().resolve()
    root = os.environ.get("TOOLROLLOUT_VIDEO_ROOT")
    if root and not target.is_relative_to(Path(root).resolve()):
        raise ToolError(f"{path} is outside the allowed folder {root}")
    if not target.is_file():
        raise ToolError(f"no such file: {path}")
    return target


def read_frames(path: str | os.PathLike[str], times: Sequence[float]) -> list[tuple[float, Any]]:
    """Decode the frame shown at each of ``times`` (seconds, ascending) as PIL images.

    Returns ``(frame_time, image)`` pairs; times past the end of the stream are skipped.
    Raises :class:`ValueError` when the file has no decodable video stream.
    """
    import av

    try:
        container = av.open(str(path))
    except av.error.FFmpegError as exc:
        raise ValueError(f"cannot open video: {exc}") from exc
    with container:
        if not container.streams.video:
            raise ValueError("the file has no video stream")
        stream = container.streams.video[0]
        base = stream.time_base
        if base is None:
            raise ValueError("the video stream has no time base")
        out: list[tuple[float, Any]] = []
        pending = list(times)
        if not pending:
            return out
        container.seek(max(int(pending[0] / base), 0), stream=stream, backward=True)
        previous: tuple[float, Any] | None = None
        try:
            for frame in container.decode(stream):
                if frame.pts is None:
                    continue
                now = float(frame.pts * base)
                # Every wanted time before this frame shows the previous frame.
                while pending and now > pending[0] + 1e-6:
                    if previous is not None:
                        out.append(previous)
                    pending.pop(0)
                if not pending:
                    break
                previous = (now, cast(Any, frame).to_image())
        except av.error.FFmpegError as exc:
            raise ValueError(f"cannot decode video: {exc}") from exc
        # Times at or after the last frame show it, up to the end of the stream.
        duration = _duration(container, stream)
        if previous is not None:
            out.extend(previous for t in pending if duration is None or t < duration)
        return out


def _duration(container: Any, stream: Any) -> float | None:
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return float(container.duration) / 1_000_000
    return None


def _png(image: Any) -> Image:
    if max(image.size) > _MAX_SIDE:
        image = image.copy()
        image.thumbnail((_MAX_SIDE, _MAX_SIDE))
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, format="PNG")
    return Image(data=buffer.getvalue(), format="png")


def _window_times(start: float, end: float, fps: float, limit: int) -> list[float]:
    count = int((end - start) * fps + 1e-9) + 1
    if count <= limit:
        return [start + k / fps for k in range(count)]
    step = (end - start) / (limit - 1) if limit > 1 else 0.0
    return [start + k * step for k in range(limit)]


def build_server() -> MCPServer[object]:
    """A fresh server exposing ``crop_video`` and ``crop_image``."""
    server: MCPServer[object] = MCPServer(
        "video_tools",
        instructions="Looks at a video: frames of a time window, or a zoomed region.",
        log_level="WARNING",
    )

    @server.tool(structured_output=False)
    def crop_video(
        video_path: Annotated[str, Field(description="Path of the video file.")],
        start_time: Annotated[float, Field(ge=0, description="Window start, in seconds.")],
        end_time: Annotated[float, Field(ge=0, description="Window end, in seconds.")],
        fps: Annotated[float, Field(gt=0, le=30, description="Frames per second to sample.")] = 1.0,
    ) -> list[Any]:
        """Return the frames of a video between start_time and end_time as images."""
        if end_time < start_time:
            raise ToolError(f"end_time {end_time} is before start_time {start_time}")
        path = _resolve(video_path)
        times = _window_times(start_time, end_time, fps, _max_frames())
        try:
            frames = read_frames(path, times)
        except ValueError as exc:
            raise ToolError(f"{video_path}: {exc}") from exc
        if not frames:
            raise ToolError(f"{video_path} has no frames between {start_time}s and {end_time}s")
        name = Path(video_path).name
        content: list[Any] = [
            f"{len(frames)} frame(s) of {name} from {start_time:g}s to {end_time:g}s"
        ]
        for when, image in frames:
            content.append(f"t={when:.2f}s")
            content.append(_png(image))
        return content

    @server.tool(structured_output=False)
    def crop_image(
        path: Annotated[str, Field(description="An image file, or a video file.")],
        left: Annotated[float, Field(ge=0, le=1, description="Left edge, fraction of width.")],
        top: Annotated[float, Field(ge=0, le=1, description="Top edge, fraction of height.")],
        right: Annotated[float, Field(ge=0, le=1, description="Right edge, fraction of width.")],
        bottom: Annotated[float, Field(ge=0, le=1, description="Bottom edge, fraction of height.")],
        time: Annotated[
            float, Field(ge=0, description="For a video: the frame at this second.")
        ] = 0.0,
    ) -> list[Any]:
        """Zoom into a region of an image (or of a video frame) and return it as an image."""
        if right <= left or bottom <= top:
            raise ToolError("the region is empty: need left < right and top < bottom")
        target = _resolve(path)
        image = _open_still(target, time)
        width, height = image.size
        box = (
            int(left * width),
            int(top * height),
            max(int(left * width) + 1, int(right * width)),
            max(int(top * height) + 1, int(bottom * height)),
        )
        region = image.crop(box)
        return [f"region {box} of {target.name}", _png(region)]

    return server


def _open_still(path: Path, time: float) -> Any:
    from PIL import Image as PILImage
    from PIL import UnidentifiedImageError

    try:
        with PILImage.open(path) as still:
            still.load()
            return still.convert("RGB")
    except (UnidentifiedImageError, OSError):
        pass  # not a still image: try it as a video
    try:
        frames = read_frames(path, [time])
    except ValueError as exc:
        raise ToolError(f"{path.name} is neither an image nor a readable video: {exc}") from exc
    if not frames:
        raise ToolError(f"{path.name} has no frame at {time}s")
    return frames[0][1]


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``python -m toolrollout.apps.mcp_servers.video_tools``."""
    serve(build_server(), argv)


if __name__ == "__main__":
    main()
