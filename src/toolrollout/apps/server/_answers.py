"""SGLang's JSON answers and error shapes, shared by the server's routes.

Two error shapes exist in SGLang (``entrypoints/http_server.py``) and both are reproduced:
request errors raised as ``ValueError`` become ``{"error": {"message": ...}}``
(:func:`error_response`); bodies that cannot be parsed go through SGLang's
``RequestValidationError`` handler, which answers OpenAI's flat ``{"object": "error",
"message", "type", "param", "code"}`` (:func:`validation_error_response`).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from toolrollout.apps.server._protocol import MalformedRequest

__all__ = [
    "DONE",
    "dumps",
    "error_response",
    "json_body",
    "json_response",
    "stream_error_chunk",
    "validation_error_response",
    "with_body",
]


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def json_response(content: Any, status_code: int = 200) -> Response:
    return Response(dumps(content), status_code=status_code, media_type="application/json")


def error_response(message: str, status_code: int = HTTPStatus.BAD_REQUEST) -> Response:
    """SGLang's ``_create_error_response``: ``{"error": {"message": ...}}``."""
    return json_response({"error": {"message": message}}, status_code)


def validation_error_response(message: str) -> Response:
    """SGLang's ``RequestValidationError`` handler: OpenAI's flat error object, HTTP 400."""
    body = {
        "object": "error",
        "message": message,
        "type": HTTPStatus.BAD_REQUEST.phrase,
        "param": None,
        "code": HTTPStatus.BAD_REQUEST.value,
    }
    return json_response(body, HTTPStatus.BAD_REQUEST)


def stream_error_chunk(message: str) -> bytes:
    error = {"message": message, "type": "invalid_request_error", "code": 400, "retryable": False}
    return b"data: " + dumps({"error": error}).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


async def json_body(request: Request) -> Any:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise MalformedRequest(f"JSON decode error: {exc}") from exc


def with_body(
    handler: Callable[[Any], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    """A route that parses the JSON body first: a body that is not JSON is SGLang's 400."""

    async def route(request: Request) -> Response:
        try:
            body = await json_body(request)
        except MalformedRequest as exc:
            return validation_error_response(str(exc))
        return await handler(body)

    route.__name__ = handler.__name__
    route.__doc__ = handler.__doc__
    return route
