"""An MCP ``CallToolResult`` turned into a :class:`~toolrollout.tools.ToolResult`.

Text blocks become the message text (joined by newlines); images are decoded into PIL
images on ``ToolResult.images``; embedded resources, resource links and audio are rendered
as text the model can read; ``structuredContent`` is kept on ``ToolResult.structured``;
``isError`` makes an error result that keeps the server's text as it is.
"""

from __future__ import annotations

import base64
import binascii
import io
from typing import Any

from mcp.types import (
    AudioContent,
    BlobResourceContents,
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
)

from toolrollout._exceptions import ToolExecutionError

from .._types import ToolResult

__all__ = ["decode_image", "mcp_result_to_tool_result"]


def decode_image(data: str, mime_type: str = "image/png") -> Any:
    """Decode base64 image data into a loaded PIL image.

    Raises :class:`ValueError` when the data is not base64 or not an image Pillow reads.
    """
    from PIL import Image, UnidentifiedImageError

    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"{mime_type} data is not valid base64") from exc
    try:
        image = Image.open(io.BytesIO(raw))
        image.load()
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise ValueError(f"{mime_type} data ({len(raw)} bytes) is not a readable image") from exc
    return image


def _blob_size(blob: str) -> int:
    try:
        return len(base64.b64decode(blob, validate=True))
    except (binascii.Error, ValueError):
        return len(blob)


def mcp_result_to_tool_result(result: CallToolResult, *, tool_name: str) -> ToolResult:
    """Convert one MCP tool result.

    An image that cannot be decoded makes the whole result malformed: it raises
    :class:`~toolrollout.exceptions.ToolExecutionError` (the executor turns it into an error
    result).
    """
    texts: list[str] = []
    images: list[Any] = []
    for index, block in enumerate(result.content):
        if isinstance(block, TextContent):
            texts.append(block.text)
        elif isinstance(block, ImageContent):
            try:
                images.append(decode_image(block.data, block.mime_type))
            except ValueError as exc:
                raise ToolExecutionError(
                    f"MCP tool {tool_name!r} returned a malformed result: content[{index}]: {exc}"
                ) from exc
        elif isinstance(block, AudioContent):
            texts.append(f"[audio: {block.mime_type}, {_blob_size(block.data)} bytes]")
        elif isinstance(block, EmbeddedResource):
            resource = block.resource
            if isinstance(resource, TextResourceContents):
                texts.append(resource.text)
            elif isinstance(resource, BlobResourceContents):
                mime = resource.mime_type or "application/octet-stream"
                if mime.startswith("image/"):
                    try:
                        images.append(decode_image(resource.blob, mime))
                        continue
                    except ValueError:
                        pass  # shown as an opaque resource below
                texts.append(
                    f"[resource {resource.uri} ({mime}): {_blob_size(resource.blob)} bytes]"
                )
        elif isinstance(block, ResourceLink):
            label = block.title or block.name
            line = f"[resource link: {label} <{block.uri}>]"
            if block.description:
                line += f" {block.description}"
            texts.append(line)
        else:  # a content type newer than this code
            texts.append(f"[unsupported content: {getattr(block, 'type', type(block).__name__)}]")
    text = "\n".join(texts)
    structured = result.structured_content
    if structured is not None and not isinstance(structured, dict):
        structured = {"result": structured}
    if not result.is_error:
        return ToolResult(text=text, images=tuple(images), structured=structured)
    message = text.strip() or "the tool reported an error without a message"
    error = ToolExecutionError(f"MCP tool {tool_name!r} reported an error: {message[:500]}")
    return ToolResult(
        text=text or f"Error: {message}",
        images=tuple(images),
        is_error=True,
        structured=structured,
        error=error,
    )
