"""Images a trajectory carries: preparation off the event loop and trainer views.

Images are prepared in a worker thread (:func:`prepare_images`), so one trajectory's pixels
never stall the others' turns. A trajectory keeps each image's PNG bytes and placeholder
span; :func:`verl_multi_modal_data`, :func:`trl_messages` and :func:`swift_row` give them
in each trainer's own shape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from toolrollout._exceptions import ImageError
from toolrollout._records import Trajectory, TrajectoryImage
from toolrollout._records._trajectory import pil_image

if TYPE_CHECKING:
    from toolrollout.chat import VisionFormat
    from toolrollout.chat._multimodal import PreparedImage

__all__ = [
    "TrajectoryImage",
    "prepare_images",
    "swift_row",
    "trl_messages",
    "verl_multi_modal_data",
]


async def prepare_images(
    vision: VisionFormat, images: Sequence[Any]
) -> list[PreparedImage | ImageError]:
    """Prepare ``images`` in a worker thread; an unreadable one yields its error in place."""

    def work() -> list[PreparedImage | ImageError]:
        out: list[PreparedImage | ImageError] = []
        for image in images:
            try:
                out.append(vision.prepare(image))
            except ImageError as exc:
                out.append(exc)
        return out

    return await anyio.to_thread.run_sync(work)


def _images_of(source: Trajectory | Mapping[str, Any]) -> list[Any]:
    if isinstance(source, Mapping):
        return [pil_image(png) for png in source.get("images") or ()]
    return [image.to_pil() for image in source.images]


def _messages_of(source: Trajectory | Mapping[str, Any]) -> list[dict[str, Any]]:
    import json

    messages = source["messages"] if isinstance(source, Mapping) else source.messages
    if isinstance(messages, str):
        messages = json.loads(messages)
    return [dict(m) for m in messages]


def verl_multi_modal_data(source: Trajectory | Mapping[str, Any]) -> dict[str, list[Any]]:
    """verl's ``AgentLoopOutput.multi_modal_data``: ``{"images": [PIL, ...]}`` in order, of
    a :class:`Trajectory` or a row read back with ``read_rows``."""
    return {"images": _images_of(source)}


def trl_messages(source: Trajectory | Mapping[str, Any]) -> list[dict[str, Any]]:
    """The conversation with TRL's image blocks (``{"type": "image", "image": PIL}``)."""
    images = iter(_images_of(source))
    out = []
    for message in _messages_of(source):
        content = message.get("content")
        if isinstance(content, list):
            parts = []
            for part in content:
                if isinstance(part, Mapping) and part.get("type") == "image":
                    try:
                        parts.append({"type": "image", "image": next(images)})
                    except StopIteration:
                        raise ImageError("the messages name more images than were kept") from None
                else:
                    parts.append(dict(part))
            message = {**message, "content": parts}
        out.append(message)
    return out


def swift_row(source: Trajectory | Mapping[str, Any]) -> dict[str, Any]:
    """ms-swift's dataset row: ``<image>`` tags in the text and an ``images`` list."""
    images = _images_of(source)
    messages = []
    for message in _messages_of(source):
        content = message.get("content")
        if isinstance(content, list):
            text = "".join(
                "<image>" if part.get("type") == "image" else str(part.get("text", ""))
                for part in content
                if isinstance(part, Mapping)
            )
            message = {**message, "content": text}
        messages.append(message)
    return {"messages": messages, "images": images}
