"""A FastAPI app that speaks SGLang's native HTTP API on top of the embedded engine.

Paths, bodies, status codes and error shapes are SGLang's (``entrypoints/http_server.py``)
so that SGLang clients, ``sglang-router`` and the project's own ``SGLangClient`` can use it
unchanged. The answers and error shapes are in ``_answers.py``, ``/generate`` in
``_generate.py``; this module builds the app and its other routes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from http import HTTPStatus
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response

from toolrollout._exceptions import ToolRolloutError, UserError
from toolrollout._security import SecurityMiddleware, ServerSecurity
from toolrollout.apps.server._answers import (
    json_response,
    validation_error_response,
    with_body,
)
from toolrollout.apps.server._generate import GenerateRoute
from toolrollout.apps.server._openai import add_chat_completions
from toolrollout.engines._types import GenerateRequest, SamplingParams
from toolrollout.engines.embedded import EmbeddedEngine

__all__ = [
    "ADMIN_PATHS",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_CONCURRENT_REQUESTS",
    "create_app",
    "default_security",
]

logger = logging.getLogger(__name__)

HEALTH_CHECK_TIMEOUT = 20.0
"""Seconds ``/health_generate`` waits for its one token (SGLang's default)."""

ADMIN_PATHS = frozenset(
    {
        "/update_weights_from_disk",
        "/update_weight_version",
        "/pause_generation",
        "/continue_generation",
        "/flush_cache",
        "/abort_request",
    }
)
"""The control endpoints the admin key guards (those SGLang marks ``ADMIN_OPTIONAL``)."""
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
"""Largest request body by default: room for long prompts with images, far below the
hundreds of megabytes a hostile ``input_ids`` list can reach."""
DEFAULT_MAX_CONCURRENT_REQUESTS = 4096
"""Requests in flight at once by default (a thousand trajectories with room to spare)."""


def default_security(**changes: Any) -> ServerSecurity:
    """This server's :class:`ServerSecurity`: its control endpoints and default limits."""
    base = ServerSecurity(
        admin_paths=ADMIN_PATHS,
        max_body_bytes=DEFAULT_MAX_BODY_BYTES,
        max_concurrent_requests=DEFAULT_MAX_CONCURRENT_REQUESTS,
    )
    return dataclasses.replace(base, **changes)


def _within(path: str, folders: Sequence[Path]) -> bool | str:
    """Whether ``path``, symlinks resolved, is one of ``folders`` or inside one; why not,
    as text, when it cannot be resolved at all (a NUL byte, a symlink loop)."""
    try:
        resolved = Path(path).resolve()
    except (OSError, ValueError, RuntimeError) as exc:
        return f"model_path {path!r} is not a usable path ({exc})"
    return any(resolved.is_relative_to(folder) for folder in folders)


def _version() -> str:
    try:
        return version("toolrollout")
    except PackageNotFoundError:
        return "0.0.0+unknown"


def create_app(
    engine: EmbeddedEngine,
    *,
    served_model_name: str | None = None,
    security: ServerSecurity | None = None,
    weights_dirs: Sequence[str | os.PathLike[str]] = (),
) -> FastAPI:
    """Build the HTTP app for ``engine``.

    The app starts the engine on startup if it is not running yet, and then also closes it
    on shutdown; an engine started by the caller is left to the caller. ``security``
    (default: :func:`default_security`, no keys) guards every request.
    ``/update_weights_from_disk`` loads only the engine's first model folder or folders
    inside ``weights_dirs``: a folder's code and weights are trusted by loading them.
    """
    model_name = served_model_name or engine.model_path
    allowed_weights = tuple(Path(p).resolve() for p in (engine.model_path, *weights_dirs))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        owned = not engine.started
        if owned:
            await engine.start()
        try:
            yield
        finally:
            if owned:
                await engine.aclose()

    app = FastAPI(title="toolrollout embedded server", version=_version(), lifespan=lifespan)
    app.add_middleware(
        SecurityMiddleware,
        security=security if security is not None else default_security(),
    )

    @app.exception_handler(RequestValidationError)
    async def _on_validation_error(_: Request, exc: RequestValidationError) -> Response:
        return validation_error_response(f"{exc} {exc.errors()}")

    _add_info_routes(app, engine, model_name)
    _add_load_routes(app, engine, model_name)
    _add_weight_routes(app, engine, allowed_weights)
    _add_control_routes(app, engine)
    app.api_route("/generate", methods=["POST", "PUT"])(GenerateRoute(engine).route)
    # OpenAI-compatible chat with tool-call parsing (for OpenAI-only peers, e.g. verifiers).
    add_chat_completions(
        app,
        tokenizer=engine.tokenizer,
        generate=engine.generate,
        model_name=model_name,
    )
    return app


def _add_info_routes(app: FastAPI, engine: EmbeddedEngine, model_name: str) -> None:
    """Health, readiness and what the server serves."""

    @app.get("/health")
    async def health() -> Response:
        """Liveness: 200 while the scheduler thread runs (probed by sglang-router)."""
        return Response(status_code=200 if engine.healthy else 503)

    @app.get("/health_generate")
    async def health_generate() -> Response:
        """Readiness: really generate one token, as SGLang does (``input_ids=[0]``)."""
        if not engine.healthy:
            return Response(status_code=503)
        probe = GenerateRequest(
            input_ids=(0,),
            sampling=SamplingParams(max_new_tokens=1, temperature=0.0),
            rid=f"HEALTH_CHECK_{time.time()}",
            return_logprob=False,
        )
        try:
            await asyncio.wait_for(engine.generate(probe), HEALTH_CHECK_TIMEOUT)
        except (TimeoutError, ToolRolloutError):
            logger.exception("health check generation failed")
            return Response(status_code=503)
        return Response(status_code=200)

    async def model_info() -> dict[str, Any]:
        return {
            "model_path": engine.model_path,
            "tokenizer_path": engine.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": engine.weight_version,
            "has_image_understanding": engine.has_vision,
            "has_audio_understanding": engine.has_audio,
            "model_type": engine.model_type,
            "architectures": list(engine.architectures),
        }

    app.get("/model_info")(model_info)
    app.get("/get_model_info")(model_info)

    async def server_info() -> dict[str, Any]:
        running, waiting = engine.num_running, engine.num_waiting
        return {
            "model_path": engine.model_path,
            "tokenizer_path": engine.model_path,
            "served_model_name": model_name,
            "context_length": engine.context_length,
            "device": engine.device,
            "dtype": engine.dtype,
            "tp_size": 1,
            "dp_size": 1,
            "max_running_requests": engine.max_batch_size,
            # No paged KV pool: the bound is max_batch_size full-context sequences.
            "max_total_num_tokens": engine.max_batch_size * engine.context_length,
            "max_req_input_len": engine.context_length - 1,
            "weight_version": engine.weight_version,
            "skip_tokenizer_init": False,
            "disable_radix_cache": True,
            # It honours sampling_seed, as SGLang does only with this flag.
            "enable_deterministic_inference": True,
            # No priority scheduling: the client then sends no priority (SGLang's defaults).
            "enable_priority_scheduling": False,
            "schedule_low_priority_values_first": False,
            "priority_scheduling_preemption_threshold": 10,
            "is_embedded_engine": True,
            "internal_states": [
                {"num_running_reqs": running, "num_waiting_reqs": waiting, "dp_rank": 0}
            ],
            "version": _version(),
        }

    app.get("/server_info")(server_info)
    app.get("/get_server_info")(server_info)


def _add_load_routes(app: FastAPI, engine: EmbeddedEngine, model_name: str) -> None:
    """The load a router balances on, and the model list."""

    @app.get("/get_load")
    async def get_load() -> list[dict[str, int]]:
        return [
            {
                "dp_rank": 0,
                "num_reqs": engine.num_running + engine.num_waiting,
                "num_waiting_reqs": engine.num_waiting,
                "num_tokens": engine.num_tokens,
            }
        ]

    @app.get("/v1/loads")
    async def v1_loads(include: str = "all") -> dict[str, Any]:
        used = engine.num_tokens
        capacity = engine.max_batch_size * engine.context_length
        load: dict[str, Any] = {
            "dp_rank": 0,
            "num_running_reqs": engine.num_running,
            "num_waiting_reqs": engine.num_waiting,
            "num_total_reqs": engine.num_running + engine.num_waiting,
            "num_used_tokens": used,
            "max_total_num_tokens": capacity,
            "token_usage": used / capacity if capacity else 0.0,
        }
        if {"all", "queues"} & {part.strip() for part in include.split(",")}:
            # SGLang's queue section (v1_loads.py); nothing is ever paused or retracted here.
            waiting = engine.num_waiting
            load["queues"] = {"waiting": waiting, "grammar": 0, "paused": 0, "retracted": 0}
        return {
            "timestamp": datetime.now(UTC).isoformat(),
            "version": _version(),
            "accelerator": engine.device,
            "num_accelerators": 1,
            "loads": [load],
        }

    @app.get("/v1/models")
    async def v1_models() -> dict[str, Any]:
        card = {
            "id": model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "toolrollout",
            "root": model_name,
            "max_model_len": engine.context_length,
        }
        return {"object": "list", "data": [card]}


def _add_weight_routes(
    app: FastAPI, engine: EmbeddedEngine, allowed_weights: tuple[Path, ...]
) -> None:
    """The weight version and the reload from disk."""

    @app.get("/get_weight_version")
    async def get_weight_version() -> dict[str, str]:
        return {"weight_version": engine.weight_version}

    async def update_weight_version(body: Any) -> Response:
        new_version = body.get("new_version") if isinstance(body, dict) else None
        if not isinstance(new_version, str):
            return validation_error_response("new_version: Field required (a string)")
        if body.get("abort_all_requests", True):
            await engine.abort_all()
        engine.weight_version = new_version
        return json_response(
            {
                "success": True,
                "message": f"Weight version updated to {new_version}",
                "new_version": new_version,
            }
        )

    async def update_weights_from_disk(body: Any) -> Response:
        """Reload weights from a model folder; 400 with ``success: false`` if it fails."""
        if not isinstance(body, dict) or not isinstance(body.get("model_path"), str):
            return validation_error_response("model_path: Field required (a string)")
        version = body.get("weight_version")
        if version is not None and not isinstance(version, str):
            return validation_error_response("weight_version must be a string")
        within = await asyncio.to_thread(_within, body["model_path"], allowed_weights)
        try:
            if within is not True:
                raise UserError(
                    within
                    or f"model_path {body['model_path']!r} is outside the folders this server "
                    "loads weights from (its model folder and --weights-dir)"
                )
            update = await engine.update_weights_from_disk(
                body["model_path"],
                weight_version=version,
                abort_all_requests=bool(body.get("abort_all_requests", False)),
            )
        except UserError as exc:
            failure = {"success": False, "message": str(exc), "num_paused_requests": 0}
            return json_response(failure, HTTPStatus.BAD_REQUEST)
        (answer,) = update.servers
        return json_response(
            {
                "success": True,
                "message": answer.message,
                "num_paused_requests": answer.num_paused_requests,
            }
        )

    app.post("/update_weight_version")(with_body(update_weight_version))
    app.post("/update_weights_from_disk")(with_body(update_weights_from_disk))


def _add_control_routes(app: FastAPI, engine: EmbeddedEngine) -> None:
    """Pause and continue (for a weight sync), flush the cache, abort requests."""

    async def pause_generation(body: Any) -> Response:
        """``{"mode": "abort"|"retract"|"in_place"}``; new /generate calls wait meanwhile."""
        mode = body.get("mode", "abort") if isinstance(body, dict) else None
        if mode not in ("abort", "retract", "in_place"):
            return validation_error_response(
                f"mode: Input should be 'abort', 'retract' or 'in_place', got {mode!r}"
            )
        await engine.pause_generation(mode)
        return json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(_: Any) -> Response:
        # The body's torch_empty_cache: nothing to empty on CPU.
        await engine.continue_generation()
        return json_response({"message": "Generation continued successfully.", "status": "ok"})

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        ok = await engine.flush_cache()
        return Response(
            content="Cache flushed.\nPlease check backend logs for more details. "
            "(When there are running or waiting requests, the operation will not be performed.)\n",
            status_code=200 if ok else HTTPStatus.BAD_REQUEST,
        )

    async def abort_request(body: Any) -> Response:
        """``{"rid": ..., "abort_all": false}``; rids match by prefix, as in SGLang."""
        if not isinstance(body, dict):
            return validation_error_response("Input should be a valid dictionary")
        rid, abort_all = body.get("rid", ""), body.get("abort_all", False)
        if not isinstance(rid, str) or not isinstance(abort_all, bool):
            return validation_error_response("rid must be a string and abort_all a boolean")
        if abort_all:
            await engine.abort_all()
        else:
            await engine.abort(rid)
        return Response(status_code=200)

    app.post("/pause_generation")(with_body(pause_generation))
    app.post("/continue_generation")(with_body(continue_generation))
    app.post("/abort_request")(with_body(abort_request))
