"""HTTP helpers every API layer of the gateway shares: who a request is, disconnects, errors.

How a request names its session (header, ``/s/<session>/`` path prefix, or a keyed hash of
its API key, never the key itself) is in docs/gateway.md, "Sessions".
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.responses import Response

from toolrollout._security import ServerSecurity, presented_key, presents_key

from ._sse import Frame, StreamWriter, relay, sse_bytes, stream_response
from ._types import ChatRequest, ChatResult, GatewayError, StreamStart, invalid

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

    from ._core import Gateway

__all__ = [
    "DEFAULT_SESSION",
    "GROUP_HEADER",
    "SESSION_HEADER",
    "Callers",
    "SessionPathMiddleware",
    "answer",
    "openai_error",
    "openai_error_body",
    "read_json",
    "request_metadata",
]

_T = TypeVar("_T")

SESSION_HEADER = "x-toolrollout-session"
GROUP_HEADER = "x-toolrollout-group"
DEFAULT_SESSION = "default"
_PREFIX = re.compile(r"^/s/([^/]+)(/.*)$")


class Callers:
    """Who a request is: its session (see the module) and whether it holds the admin key.

    What a session made (its metrics, its stored responses) is shown to requests of that
    session, or to the admin key's; the secret of the key hash never leaves the process.
    """

    def __init__(self, security: ServerSecurity) -> None:
        self.security = security
        self._secret = secrets.token_bytes(32)

    def session(self, request: Request) -> str:
        """The session a request belongs to (header, path prefix, key hash, ``default``)."""
        header = request.headers.get(SESSION_HEADER, "").strip()
        if header:
            return header
        key = presented_key(request.scope)
        if not key or self.is_admin(request) or presents_key(request.scope, self.security.api_key):
            return DEFAULT_SESSION
        digest = hmac.new(self._secret, key.encode("utf-8"), hashlib.sha256).hexdigest()
        return f"key-{digest[:24]}"

    def is_admin(self, request: Request) -> bool:
        """Whether the request carries the admin key (never without one set)."""
        return presents_key(request.scope, self.security.admin_api_key)

    def may_see(self, request: Request, session: str) -> bool:
        """Whether ``request`` may read what ``session`` made: its own, or the admin's."""
        return self.is_admin(request) or hmac.compare_digest(
            self.session(request).encode("utf-8"), session.encode("utf-8")
        )


def request_metadata(request: Request) -> dict[str, Any]:
    """Per-request options from headers: the GRPO group a session belongs to."""
    group = request.headers.get(GROUP_HEADER)
    return {"group": group.strip()} if group and group.strip() else {}


class SessionPathMiddleware:
    """``/s/<session>/v1/...`` is served as ``/v1/...`` with the session header set."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            match = _PREFIX.match(scope.get("path", ""))
            if match is not None:
                from urllib.parse import unquote

                session, rest = unquote(match.group(1)), match.group(2)
                headers = [
                    (k, v) for k, v in scope.get("headers", []) if k != b"x-toolrollout-session"
                ]
                headers.append((b"x-toolrollout-session", session.encode()))
                scope = {**scope, "path": rest, "raw_path": rest.encode(), "headers": headers}
        await self.app(scope, receive, send)


async def read_json(
    http_request: Request, *, empty: bytes = b"null", error: str = "the request body is not JSON"
) -> Any:
    """The request's JSON body (``empty`` when it has none); a 400 when it is not JSON."""
    try:
        return json.loads(await http_request.body() or empty)
    except ValueError as exc:
        raise invalid(f"{error}: {exc}") from None


async def answer(
    gateway: Gateway,
    http_request: Request,
    chat_request: ChatRequest,
    *,
    stream: bool,
    whole: Callable[[ChatResult], dict[str, Any]],
    writer: Callable[[StreamStart], StreamWriter],
    encode: Callable[[Frame], bytes] = sse_bytes,
    tail: bytes = b"",
) -> Response:
    """The answer in an API's shape: ``whole(result)`` as JSON, or the events ``writer``
    makes of the stream as it is generated. Errors before the answer starts (the stream's
    :class:`StreamStart`) raise here, to be answered as an HTTP error.

    The body must have been read already: the next ASGI message is then the disconnect,
    which cancels the wait for the answer or its start (the engine request is aborted);
    after the start, the streaming response notices it and closes the stream.
    """
    if not stream:
        result = await _until_disconnect(http_request, lambda: gateway.complete(chat_request))
        return JSONResponse(whole(result))
    items = gateway.stream(chat_request)
    try:
        start = await _until_disconnect(http_request, lambda: anext(items))
    except BaseException:
        await items.aclose()
        raise
    assert isinstance(start, StreamStart)
    return stream_response(relay(items, writer(start), encode, tail=tail))


async def _until_disconnect(http_request: Request, call: Callable[[], Awaitable[_T]]) -> _T:
    """``await call()`` beside a watcher of the connection, in one task group: a disconnect
    cancels the call (its generation is aborted in the engine) and ends the request."""
    outcome: list[_T] = []
    failure: list[Exception] = []
    async with anyio.create_task_group() as tasks:

        async def watch() -> None:
            while (await http_request.receive()).get("type") != "http.disconnect":
                pass
            tasks.cancel_scope.cancel()

        tasks.start_soon(watch)
        try:
            outcome.append(await call())
        except Exception as exc:  # raised as itself below, not inside the group's
            failure.append(exc)
        tasks.cancel_scope.cancel()
    if failure:
        raise failure[0]
    if not outcome:  # the client went away: there is no one to answer
        raise anyio.get_cancelled_exc_class()()
    return outcome[0]


_OPENAI_TYPES = {
    "invalid_request": "invalid_request_error",
    "context_length_exceeded": "invalid_request_error",
    "overloaded": "rate_limit_error",
    "timeout": "timeout_error",
    "engine_error": "server_error",
    "tool_choice_unmet": "server_error",
}


def openai_error_body(error: GatewayError, *, context_param: str = "messages") -> dict[str, Any]:
    """OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``; a context
    overflow names ``context_param`` (the messages, or a Responses request's input)."""
    code: str | None = None
    param: str | None = None
    if error.kind == "overloaded":
        code = "rate_limit_exceeded"
    if error.kind == "context_length_exceeded":
        code, param = error.kind, context_param
    return {
        "error": {
            "message": error.message,
            "type": _OPENAI_TYPES.get(error.kind, "server_error"),
            "param": param,
            "code": code,
        }
    }


def openai_error(error: GatewayError, *, context_param: str = "messages") -> JSONResponse:
    """The error as OpenAI's API answers it (status and body; an overload asks the SDK to
    retry after a second)."""
    headers = {"retry-after": "1"} if error.kind == "overloaded" else None
    body = openai_error_body(error, context_param=context_param)
    return JSONResponse(body, status_code=error.status, headers=headers)
