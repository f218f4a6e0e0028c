"""Content parts of the Responses and Messages APIs in OpenAI chat form.

The canonical request keeps a message's content as a string when it is one piece of text
(the form every chat template renders) and as a list of OpenAI chat parts otherwise
(``{"type": "text", "text"}``, ``{"type": "image_url", "image_url": {"url"}}``), so text
is never joined with a separator the harness did not send.
"""

from __future__ import annotations

from typing import Any

from ._types import GatewayError

__all__ = ["chat_content", "invalid", "require_str"]


def invalid(message: str) -> GatewayError:
    """A 400 in the API's own shape: the request cannot be translated."""
    return GatewayError("invalid_request", message, status=400)


def require_str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise invalid(f"{where}: expected a string, got {type(value).__name__}")
    return value


def chat_content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """One text part becomes a string (none: the empty string); several parts, or an
    image, stay a list."""
    if not parts:
        return ""
    if len(parts) == 1 and parts[0]["type"] == "text":
        text: str = parts[0]["text"]
        return text
    return parts
