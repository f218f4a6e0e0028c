"""An MCP ``CallToolResult`` turned into a :class:`~toolrollout.tools.ToolResult`: text
blocks joined, images decoded (as leniently as libpng), other content rendered as text.
"""

from __future__ import annotations

import base64
import binascii
import io
import logging
import struct
import zlib
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

logger = logging.getLogger(__name__)

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _drop_bad_ancillary_chunks(raw: bytes) -> bytes | None:
    """The PNG without its ancillary chunks whose CRC is wrong, or None when there are
    none (or the data is not a PNG whose chunk layout can be walked).

    libpng treats a bad CRC in an ancillary chunk (lower-case first letter) as a benign
    error and skips the chunk; browsers and ``file`` read such images. Pillow refuses them
    unless the process-wide ``LOAD_TRUNCATED_IMAGES`` is set, which would change decoding
    for every other caller too, so the chunks are removed here instead.
    """
    if not raw.startswith(_PNG_SIGNATURE):
        return None
    kept = [_PNG_SIGNATURE]
    dropped = False
    offset = len(_PNG_SIGNATURE)
    while offset + 12 <= len(raw):
        (length,) = struct.unpack(">I", raw[offset : offset + 4])
        end = offset + 12 + length
        if end > len(raw):
            return None
        kind = raw[offset + 4 : offset + 8]
        body = raw[offset + 8 : offset + 8 + length]
        (crc,) = struct.unpack(">I", raw[offset + 8 + length : end])
        ancillary = bool(kind[0] & 0x20)
        if ancillary and zlib.crc32(kind + body) != crc:
            dropped = True
        else:
            kept.append(raw[offset:end])
        offset = end
        if kind == b"IEND":
            break
    return b"".join(kept) if dropped else None


def decode_image(data: str, mime_type: str = "image/png") -> Any:
    """Decode base64 image data into a loaded PIL image (a PNG without its bad ancillary
    chunks if need be); ValueError when it is not one."""
    from PIL import Image, UnidentifiedImageError

    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"{mime_type} data is not valid base64") from exc
    errors = (UnidentifiedImageError, OSError, ValueError, SyntaxError)
    try:
        image = Image.open(io.BytesIO(raw))
        image.load()
        return image
    except Image.DecompressionBombError as exc:
        raise ValueError(f"{mime_type} data ({len(raw)} bytes): {exc}") from exc
    except errors as exc:
        first: Exception = exc
    repaired = _drop_bad_ancillary_chunks(raw)
    if repaired is not None:
        try:
            image = Image.open(io.BytesIO(repaired))
            image.load()
            logger.debug("decoded a PNG after dropping ancillary chunks with bad CRCs")
            return image
        except (*errors, Image.DecompressionBombError):
            pass
    raise ValueError(f"{mime_type} data ({len(raw)} bytes) is not a readable image") from first


def _blob_size(blob: str) -> int:
    try:
        return len(base64.b64decode(blob, validate=True))
    except (binascii.Error, ValueError):
        return len(blob)


_TEXT_MIME_TYPES = ("application/json", "application/xml", "application/yaml")


def _blob_text(blob: str, mime: str) -> str | None:
    """A blob resource of a textual type (``text/*``, JSON, XML, YAML) as text, if it is
    UTF-8: servers send plain text as a blob too, and the model should read it."""
    base = mime.split(";", 1)[0].strip().lower()
    if not (base.startswith("text/") or base in _TEXT_MIME_TYPES or base.endswith("+json")):
        return None
    try:
        return base64.b64decode(blob, validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return None


def mcp_result_to_tool_result(result: CallToolResult, *, tool_name: str) -> ToolResult:
    """Convert one MCP tool result (an undecodable image becomes ``[image dropped: ...]``)."""
    texts: list[str] = []
    images: list[Any] = []
    for index, block in enumerate(result.content):
        if isinstance(block, TextContent):
            texts.append(block.text)
        elif isinstance(block, ImageContent):
            try:
                images.append(decode_image(block.data, block.mime_type))
            except ValueError as exc:
                logger.warning("MCP tool %r: content[%d] dropped: %s", tool_name, index, exc)
                texts.append(f"[image dropped: {exc}]")
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
                decoded = _blob_text(resource.blob, mime)
                if decoded is not None:
                    texts.append(decoded)
                    continue
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
