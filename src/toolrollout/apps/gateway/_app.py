"""The gateway's FastAPI app: every API it speaks, plus the session endpoints.

The session endpoints (metrics, rewards, close) are the trainer's: the admin key opens them
when one is set, so a harness holding the API key can neither score itself nor list
others. See docs/gateway.md and docs/security.md.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from toolrollout._security import SecurityMiddleware, ServerSecurity

from ._anthropic import add_anthropic_routes
from ._chat import add_chat_routes
from ._http import Callers, SessionPathMiddleware, openai_error, read_json
from ._responses import add_responses_routes
from ._types import GatewayError, invalid

if TYPE_CHECKING:
    from ._core import Gateway

__all__ = ["DEFAULT_MAX_BODY_BYTES", "build_app", "gateway_security"]

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
"""``--max-body-mb`` 64: a long conversation with inline base64 images fits."""

CONTROL_PATHS = (r"/v1/sessions", r"/v1/sessions/[^/]+", r"/v1/sessions/[^/]+/(reward|close)")


def gateway_security(gateway: Gateway, **changes: Any) -> ServerSecurity:
    """The gateway's :class:`ServerSecurity`: its control endpoints, the default body
    limit, and at most ``max_concurrency + max_waiting`` requests at once (its generation
    slots and waiting line), counted before a body is read."""
    config = gateway.config
    base = ServerSecurity(
        admin_path_patterns=CONTROL_PATHS,
        max_body_bytes=DEFAULT_MAX_BODY_BYTES,
        max_concurrent_requests=config.max_concurrency + config.max_waiting,
    )
    return dataclasses.replace(base, **changes)


def build_app(gateway: Gateway, *, security: ServerSecurity | None = None) -> FastAPI:
    """The HTTP app serving ``gateway`` (its lifetime is the caller's: enter it first),
    guarded by ``security`` (default: :func:`gateway_security`, no key)."""
    security = security if security is not None else gateway_security(gateway)
    app = FastAPI(title="toolrollout gateway", docs_url=None, redoc_url=None)
    app.state.callers = Callers(security)
    add_chat_routes(app, gateway)
    add_responses_routes(app, gateway)
    add_anthropic_routes(app, gateway)
    _add_session_routes(app, gateway, app.state.callers)
    app.add_middleware(SecurityMiddleware, security=security)
    app.add_middleware(SessionPathMiddleware)  # outermost: the checks see the real path
    return app


async def _json_body(request: Request) -> dict[str, Any]:
    body = await read_json(request, empty=b"{}", error="JSON decode error")
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    return body


def _add_session_routes(app: FastAPI, gateway: Gateway, callers: Callers) -> None:
    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics() -> dict[str, Any]:
        return {**gateway.stats, "open_sessions": len(gateway.sessions())}

    @app.get("/v1/sessions")
    async def sessions(request: Request) -> dict[str, Any]:
        if callers.is_admin(request):
            return {"sessions": gateway.sessions()}
        own = gateway.session(callers.session(request))
        return {"sessions": {} if own is None else {own.key: own.metrics()}}

    @app.get("/v1/sessions/{session}", response_model=None)
    async def session(session: str, request: Request) -> JSONResponse | dict[str, Any]:
        found = gateway.sessions().get(session)
        if found is None or not callers.may_see(request, session):
            return openai_error(invalid(f"no open session {session!r}", status=404))
        return found

    @app.post("/v1/sessions/{session}/reward", response_model=None)
    async def reward(session: str, request: Request) -> JSONResponse | dict[str, Any]:
        try:
            body = await _json_body(request)
            segment = body.get("segment")
            if segment is not None and (isinstance(segment, bool) or not isinstance(segment, int)):
                raise invalid("segment must be an integer")
            gateway.attach_reward(session, body.get("reward"), segment)  # type: ignore[arg-type]
        except GatewayError as exc:
            return openai_error(exc)
        return {"session": session, "reward": body.get("reward"), "segment": segment}

    @app.post("/v1/sessions/{session}/close", response_model=None)
    async def close(session: str, request: Request) -> JSONResponse | dict[str, Any]:
        try:
            body = await _json_body(request)
            rows = gateway.close_session(session, body.get("reward"))
        except GatewayError as exc:
            return openai_error(exc)
        return {
            "session": session,
            "rows": [
                {
                    "uid": r.uid,
                    "segment": r.sample_index,
                    "segment_reason": r.metrics["gateway"]["segment_reason"],
                    "num_turns": r.num_turns,
                    "reward": r.reward,
                }
                for r in rows
            ],
        }
