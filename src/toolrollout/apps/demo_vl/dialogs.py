"""The VL demo's dialogs: questions about a window of a synthetic clip, answered with the
real ``crop_video`` tool (the MCP server's own function, converted by the MCP backend).

Clip seeds from :data:`HELDOUT_SEED_BASE` on are never used in training.
"""

from __future__ import annotations

import io
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from toolrollout.apps.demo_vl.video import Segment, make_video, plan_segments

__all__ = [
    "HELDOUT_SEED_BASE",
    "QUESTION_TEMPLATES",
    "answer_text",
    "call_arguments",
    "clip_name",
    "crop_turn",
    "png",
    "question",
    "tool_result",
    "video_dialogs",
    "video_tool_schemas",
    "windows",
]

QUESTION_TEMPLATES: Final = (
    "What colour is shown from second {a} to second {b} of {name}?",
    "Which colour does {name} show between {a}s and {b}s?",
    "Look at {name} from {a}s to {b}s: what colour is the screen?",
)
"""How a question about a clip window is phrased (the window and file are copied)."""
_NAMES: Final = ("clip", "video", "movie", "cam", "scene", "shot", "demo", "take")
HELDOUT_SEED_BASE: Final = 10_000
"""Clip seeds from here on are never used in training (the quality test draws them)."""


def clip_name(rng: random.Random) -> str:
    """A short file name such as ``clip3.mp4`` (the model copies it into the call)."""
    return f"{rng.choice(_NAMES)}{rng.randrange(10)}.mp4"


def windows(segments: Sequence[Segment]) -> list[tuple[int, int, str]]:
    """Whole-second windows ``(a, b, colour)`` that lie inside one segment."""
    out: list[tuple[int, int, str]] = []
    for segment in segments:
        start, end = int(segment.start), int(segment.end)
        out.extend((a, b, segment.colour) for a in range(start, end) for b in range(a, end))
    return out


def question(rng: random.Random, name: str, a: int, b: int) -> str:
    """The user's question for window ``a..b`` of ``name``."""
    return rng.choice(QUESTION_TEMPLATES).format(a=a, b=b, name=name)


def answer_text(colour: str) -> str:
    """The assistant's final answer once it has seen the frames."""
    return f"The screen is {colour}."


def call_arguments(name: str, a: int, b: int) -> str:
    """The JSON arguments of the ``crop_video`` call for window ``a..b``."""
    return json.dumps({"video_path": name, "start_time": a, "end_time": b})


def video_tool_schemas(selected: Sequence[str] = ("crop_video",)) -> list[dict[str, Any]]:
    """The schemas the MCP tools present for ``selected`` (as ``tool_configs/video_demo.yaml``).

    Only ``crop_video`` by default: with ``crop_image`` too the system turn alone is longer
    than the demo's 1024-token context.
    """
    import anyio

    from toolrollout.apps.mcp_servers.video_tools import build_server

    async def listing() -> list[Any]:
        return list(await build_server().list_tools())

    out = []
    for info in anyio.run(listing):
        if info.name not in selected:
            continue
        parameters = dict(info.input_schema or {})
        parameters.setdefault("type", "object")
        parameters.setdefault("properties", {})
        out.append(
            {
                "type": "function",
                "function": {
                    "name": info.name,
                    "description": info.description or info.title or "",
                    "parameters": parameters,
                },
            }
        )
    return out


def tool_result(path: Path, a: int, b: int) -> tuple[str, list[Any]]:
    """Call the real ``crop_video`` in process; return the message text and PIL frames."""
    import anyio
    from mcp.types import CallToolResult

    from toolrollout.apps.mcp_servers.video_tools import build_server
    from toolrollout.tools.mcp._results import mcp_result_to_tool_result

    server = build_server()

    async def call() -> Any:
        return await server.call_tool(
            "crop_video", {"video_path": str(path), "start_time": a, "end_time": b}
        )

    raw = anyio.run(call)
    result = raw if isinstance(raw, CallToolResult) else CallToolResult(content=list(raw))
    converted = mcp_result_to_tool_result(result, tool_name="crop_video")
    if converted.is_error:
        raise RuntimeError(f"crop_video failed on {path}: {converted.text}")
    return converted.text, list(converted.images)


def crop_turn(call: dict[str, Any], text: str, images: int) -> list[dict[str, Any]]:
    """The assistant's ``crop_video`` call (``{"name", "arguments"}``) and the tool's
    answer: ``images`` frames, then ``text``."""
    content = [{"type": "image"} for _ in range(images)] + [{"type": "text", "text": text}]
    return [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": call}],
        },
        {"role": "tool", "name": "crop_video", "content": content},
    ]


def video_dialogs(
    n_clips: int, *, seed: int, workdir: Path, per_clip: int = 3
) -> list[tuple[list[dict[str, Any]], list[bytes]]]:
    """Dialogs about ``n_clips`` fresh clips, ``per_clip`` random windows each.

    Many clips with few windows each, and file names reused across clips, so that the name
    and window never tell the colour: only the frames do.
    """
    rng = random.Random(seed)
    out: list[tuple[list[dict[str, Any]], list[bytes]]] = []
    for clip in range(n_clips):
        segments = plan_segments(seed * 1000 + clip)
        name = clip_name(rng)
        path = make_video(workdir / f"{clip}" / name, segments)
        for a, b, colour in rng.sample(windows(segments), per_clip):
            text, frames = tool_result(path, a, b)
            pngs = [png(frame) for frame in frames]
            call = {"name": "crop_video", "arguments": call_arguments(name, a, b)}
            messages: list[dict[str, Any]] = [
                {"role": "user", "content": question(rng, name, a, b)},
                *crop_turn(call, text, len(pngs)),
                {"role": "assistant", "content": answer_text(colour)},
            ]
            out.append((messages, pngs))
    return out


def png(frame: Any) -> bytes:
    buffer = io.BytesIO()
    frame.convert("RGB").save(buffer, format="PNG")
    return buffer.getvalue()
