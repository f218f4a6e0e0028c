"""The gateway's FastAPI app: every API it speaks, plus the session endpoints.

Session endpoints (for the trainer side, not the harness):

* ``GET /v1/sessions``: the open sessions' metrics; ``GET /v1/sessions/{id}``: one.
* ``POST /v1/sessions/{id}/reward`` ``{"reward": 1.0, "segment": 0?}``: score it.
* ``POST /v1/sessions/{id}/close`` ``{"reward": 1.0?}``: write its rows now.
* ``GET /health`` and ``GET /metrics`` (gateway-wide counts).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ._anthropic import add_anthropic_routes
from ._chat import add_chat_routes
from ._http import SessionPathMiddleware, openai_error
from ._responses import add_responses_routes
from ._types import GatewayError

if TYPE_CHECKING:
    from ._core import Gateway

__all__ = ["build_app"]


def build_app(gateway: Gateway) -> FastAPI:
    """The HTTP app serving ``gateway`` (its lifetime is the caller's: enter it first)."""
    app = FastAPI(title="toolrollout gateway", docs_url=None, redoc_url=None)
    add_chat_routes(app, gateway)
    add_responses_routes(app, gateway)
    add_anthropic_routes(app, gateway)
    _add_session_routes(app, gateway)
    app.add_middleware(SessionPathMiddleware)
    return app


async def _json_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw:
        return {}
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise GatewayError("invalid_request", f"JSON decode error: {exc}", status=400) from None
    if not isinstance(body, dict):
        raise GatewayError("invalid_request", "the request body must be a JSON object", status=400)
    return body


def _add_session_routes(app: FastAPI, gateway: Gateway) -> None:
    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics() -> dict[str, Any]:
        return {**gateway.stats, "open_sessions": len(gateway.sessions())}

    @app.get("/v1/sessions")
    async def sessions() -> dict[str, Any]:
        return {"sessions": gateway.sessions()}

    @app.get("/v1/sessions/{session}", response_model=None)
    async def session(session: str) -> JSONResponse | dict[str, Any]:
        found = gateway.sessions().get(session)
        if found is None:
            return openai_error(
                GatewayError("invalid_request", f"no open session {session!r}", status=404)
            )
        return found

    @app.post("/v1/sessions/{session}/reward", response_model=None)
    async def reward(session: str, request: Request) -> JSONResponse | dict[str, Any]:
        try:
            body = await _json_body(request)
            segment = body.get("segment")
            if segment is not None and (isinstance(segment, bool) or not isinstance(segment, int)):
                raise GatewayError("invalid_request", "segment must be an integer", status=400)
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
