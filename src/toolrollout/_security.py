"""Who may use a toolrollout server, and how much one request may cost it.

Every toolrollout server wraps its ASGI app in :class:`SecurityMiddleware` (API keys as
SGLang's ``--api-key`` / ``--admin-api-key``, body and concurrency limits) and checks its
bind address with :func:`check_bind` before it listens. See docs/security.md.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import os
import re
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from toolrollout._exceptions import UserError

__all__ = [
    "ADMIN_API_KEY_ENV",
    "API_KEY_ENV",
    "ENGINE_API_KEY_ENV",
    "OPEN_PATH_PREFIXES",
    "SecurityMiddleware",
    "ServerSecurity",
    "bearer_headers",
    "check_bind",
    "expand_env",
    "is_loopback",
    "keyless_environ",
    "presented_key",
    "presents_key",
    "resolve_key",
]

logger = logging.getLogger(__name__)

API_KEY_ENV = "TOOLROLLOUT_API_KEY"
"""The API key of a server started by toolrollout, when ``--api-key`` is not given."""
ADMIN_API_KEY_ENV = "TOOLROLLOUT_ADMIN_API_KEY"
"""The admin key of ``toolrollout serve`` (control endpoints), when ``--admin-api-key`` is
not given."""
ENGINE_API_KEY_ENV = "TOOLROLLOUT_ENGINE_API_KEY"
"""The key ``generate`` / ``eval`` send to ``--engine-url`` servers, when
``--engine-api-key`` is not given."""

OPEN_PATH_PREFIXES = ("/health", "/ready", "/metrics")
"""Paths open without a key (SGLang's list: probes and scrapers carry no secret)."""

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def resolve_key(value: str | None, env: str) -> str | None:
    """``value`` if given, else the environment variable ``env``; empty means none."""
    key = value if value is not None else os.environ.get(env)
    return key if key else None


_ENV_REFERENCE = re.compile(r"\$\{(?:env:)?([A-Za-z_][A-Za-z0-9_]*)\}")


def expand_env(value: str, *, where: str) -> str:
    """``value`` with each ``${NAME}`` (or ``${env:NAME}``) replaced by that environment
    variable, so a config can name a key without holding it; an unset one is a UserError."""

    def lookup(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in os.environ:
            raise UserError(f"{where}: environment variable {name} is not set")
        return os.environ[name]

    return _ENV_REFERENCE.sub(lookup, value)


def keyless_environ() -> dict[str, str]:
    """This process's environment less the server-key variables: for a loopback server a
    tool starts itself (``local_sandbox``, ``local_corpus``), which must not demand a key
    that its tool was never given."""
    return {k: v for k, v in os.environ.items() if k not in (API_KEY_ENV, ADMIN_API_KEY_ENV)}


def bearer_headers(api_key: str | None) -> dict[str, str]:
    """``{"Authorization": "Bearer <key>"}``, or nothing without a key."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


@dataclass(frozen=True, kw_only=True)
class ServerSecurity:
    """A server's keys and limits (the keys never show in its ``repr``)."""

    api_key: str | None = field(default=None, repr=False)
    admin_api_key: str | None = field(default=None, repr=False)
    admin_paths: frozenset[str] = frozenset()
    """Control endpoints: the admin key opens them when one is set (SGLang's
    ``ADMIN_OPTIONAL``)."""
    admin_path_patterns: tuple[str, ...] = ()
    """Control endpoints as regular expressions the whole path must match."""
    open_paths: tuple[str, ...] = OPEN_PATH_PREFIXES
    """Path prefixes open without any key."""
    max_body_bytes: int | None = None
    """Largest request body (None: no limit)."""
    max_concurrent_requests: int | None = None
    """Requests served at once before new ones get 429 (None: no cap). Open paths do not
    count, so a busy server still answers its health probe."""
    retry_after_seconds: int = 1
    """Sent as ``Retry-After`` with a 429."""

    def __post_init__(self) -> None:
        for name in ("api_key", "admin_api_key"):
            if getattr(self, name) == "":
                object.__setattr__(self, name, None)
        if self.max_body_bytes is not None and self.max_body_bytes < 0:
            raise UserError(f"the body size limit must be >= 0, got {self.max_body_bytes}")
        if self.max_concurrent_requests is not None and self.max_concurrent_requests < 1:
            raise UserError(
                f"the concurrency cap must be at least 1, got {self.max_concurrent_requests}"
            )
        if self.retry_after_seconds < 0:
            raise UserError(f"Retry-After must be >= 0, got {self.retry_after_seconds}")

    def describe(self) -> dict[str, Any]:
        """What a health endpoint may say about it (whether keys are set, never the keys)."""
        return {
            "api_key_required": self.api_key is not None,
            "admin_api_key_required": self.admin_api_key is not None,
            "max_body_bytes": self.max_body_bytes,
            "max_concurrent_requests": self.max_concurrent_requests,
        }


def _matches(expected: str, authorization: bytes | None, x_api_key: bytes | None) -> bool:
    """Whether the request carries ``expected`` (compared in constant time, as bytes)."""
    want = expected.encode("utf-8")
    if authorization is not None:
        scheme, _, token = authorization.partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), want):
            return True
    return x_api_key is not None and hmac.compare_digest(x_api_key, want)


def presents_key(scope: Scope, key: str | None) -> bool:
    """Whether the request of ``scope`` carries ``key`` (``Authorization: Bearer`` or
    ``x-api-key``, compared in constant time); never for no key."""
    if not key:
        return False
    return _matches(key, _header(scope, b"authorization"), _header(scope, b"x-api-key"))


def presented_key(scope: Scope) -> str:
    """The key a request carries (``Authorization: Bearer``, else ``x-api-key``); "" for
    none."""
    scheme, _, token = (_header(scope, b"authorization") or b"").partition(b" ")
    if scheme.lower() == b"bearer" and token.strip():
        return token.strip().decode("utf-8", "replace")
    return (_header(scope, b"x-api-key") or b"").strip().decode("utf-8", "replace")


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value)
    return None


class _BodyTooLarge(Exception):
    """Raised into the app when its body goes over the limit (the app never gets more)."""


async def _send_json(
    send: Send, status: int, body: dict[str, Any], headers: Iterable[tuple[bytes, bytes]] = ()
) -> None:
    raw = json.dumps(body, separators=(",", ":")).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(raw)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": raw})


class SecurityMiddleware:
    """ASGI middleware: API keys (401), body size limit (413) and concurrency cap (429),
    checked in that order (see the module)."""

    def __init__(self, app: ASGIApp, security: ServerSecurity) -> None:
        self.app = app
        self.security = security
        self._in_flight = 0

    @property
    def in_flight(self) -> int:
        """Requests being served now (open paths not counted)."""
        return self._in_flight

    def _allowed(self, scope: Scope, path: str) -> bool:
        s = self.security
        control = path in s.admin_paths or any(
            re.fullmatch(pattern, path) for pattern in s.admin_path_patterns
        )
        expected = (s.admin_api_key or s.api_key) if control else s.api_key
        return expected is None or presents_key(scope, expected)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            path = str(scope.get("path", ""))
            if not path.startswith(self.security.open_paths) and not self._allowed(scope, path):
                await send({"type": "websocket.close", "code": 1008})
                return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", ""))
        is_open = scope.get("method") == "OPTIONS" or path.startswith(self.security.open_paths)
        if not is_open and not self._allowed(scope, path):
            await _send_json(
                send, 401, {"error": "Unauthorized"}, [(b"www-authenticate", b"Bearer")]
            )
            return
        limit = self.security.max_body_bytes
        if limit is not None:
            declared = _header(scope, b"content-length")
            if declared is not None:
                try:
                    size = int(declared)
                except ValueError:
                    await _send_json(send, 400, {"error": "Bad Request", "message": "bad length"})
                    return
                if size > limit:
                    await self._too_large(send, limit)
                    return
        cap = self.security.max_concurrent_requests
        if cap is not None and not is_open:
            if self._in_flight >= cap:
                retry = str(self.security.retry_after_seconds).encode()
                message = f"the server is serving its limit of {cap} requests; retry later"
                await _send_json(
                    send,
                    429,
                    {"error": "Too Many Requests", "message": message},
                    [(b"retry-after", retry)],
                )
                return
            self._in_flight += 1
            try:
                await self._serve(scope, receive, send, limit)
            finally:
                self._in_flight -= 1
            return
        await self._serve(scope, receive, send, limit)

    async def _serve(self, scope: Scope, receive: Receive, send: Send, limit: int | None) -> None:
        if limit is None:
            await self.app(scope, receive, send)
            return
        received = 0
        exceeded = False
        started = False

        async def limited_receive() -> Message:
            nonlocal received, exceeded
            if exceeded:
                raise _BodyTooLarge
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    exceeded = True
                    raise _BodyTooLarge
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if exceeded and not started:
                return  # the app's answer to the exception (a 400 or 500): ours replaces it
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except _BodyTooLarge:
            pass
        except Exception:
            if not exceeded:
                raise
        if exceeded and not started:
            await self._too_large(send, limit)

    @staticmethod
    async def _too_large(send: Send, limit: int) -> None:
        message = f"the request body is larger than this server's limit of {limit} bytes"
        await _send_json(send, 413, {"error": "Payload Too Large", "message": message})


def is_loopback(host: str) -> bool:
    """Whether ``host`` reaches this machine only (``localhost``, 127.0.0.0/8, ``::1``);
    any other name counts as reachable from elsewhere."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, security: ServerSecurity, *, insecure: bool, server: str) -> None:
    """Refuse to serve a non-loopback ``host`` without a key (UserError), unless
    ``insecure``: then warn that anyone who can reach it may use it."""
    if is_loopback(host) or security.api_key:
        return
    if not insecure:
        raise UserError(
            f"refusing to serve {server} on {host} without an API key: anyone who can "
            f"reach it could use it. Set {API_KEY_ENV} (or --api-key), bind 127.0.0.1, "
            "or pass --insecure to serve it open"
        )
    logger.warning(
        "%s: serving on %s WITHOUT an API key (--insecure): anyone who can reach this "
        "address can use it",
        server,
        host,
    )
