"""The latency-model server: SGLang's ``/generate`` (and OpenAI chat) without a model.

It stands in for a GPU server so that the rollout *orchestration* can be measured at a
scale (1,024 concurrent trajectories) no CPU model reaches. This is its HTTP face; when each
request is answered, and with which ids, is the simulated scheduler's (``_scheduler.py``).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from http import HTTPStatus
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from toolrollout._exceptions import UserError
from toolrollout.apps.server._answers import error_response, json_response
from toolrollout.engines._types import GenerateRequest, GenerateResult

from ._model import LatencyModel, PriorityRefused, ServerScheduling
from ._scheduler import LatencyServer
from ._tools import serve

__all__ = ["create_latency_app", "main"]


def _generate_json(result: GenerateResult, *, return_logprob: bool) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": result.rid,
        "finish_reason": result.finish_reason.to_sglang(),
        "prompt_tokens": result.prompt_tokens,
        "weight_version": "default",
        "completion_tokens": result.completion_tokens,
        "cached_tokens": result.cached_tokens,
        "e2e_latency": result.e2e_latency,
        # SGLang's runs of output ids by weight version (utils/weight_versions.py).
        "weight_versions": [{"version": "default", "start": 0, "end": result.completion_tokens}],
    }
    if return_logprob and result.output_logprobs is not None:
        meta["output_token_logprobs"] = [
            [lp, token, None]
            for lp, token in zip(result.output_logprobs, result.output_ids, strict=True)
        ]
    return {"text": result.text, "output_ids": list(result.output_ids), "meta_info": meta}


def _request_from_body(body: Any) -> tuple[GenerateRequest, bool, int | None]:
    from toolrollout.engines._types import SamplingParams

    if not isinstance(body, dict):
        raise UserError("the request body must be a JSON object")
    ids = body.get("input_ids")
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        raise UserError("this server needs input_ids as one flat list of token ids")
    if body.get("stream"):
        raise UserError("stream=true is not supported by the latency-model server")
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise UserError("sampling_params must be an object")
    if params.get("n", 1) != 1:
        raise UserError("n > 1 is not supported by the latency-model server")
    max_new = params.get("max_new_tokens", 128)
    if not isinstance(max_new, int) or max_new < 1:
        raise UserError("sampling_params.max_new_tokens must be a positive integer")
    rid = body.get("rid")
    priority = body.get("priority")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
        raise UserError("priority must be an integer")
    request = GenerateRequest(
        input_ids=tuple(ids),
        sampling=SamplingParams(
            max_new_tokens=max_new, ignore_eos=params.get("ignore_eos") is True
        ),
        rid=rid if isinstance(rid, str) else None,
    )
    return request, bool(body.get("return_logprob", False)), priority


def _server_info(server: LatencyServer) -> dict[str, Any]:
    """SGLang's ``/server_info`` fields for the stand-in, its scheduling settings included."""
    sched = server.scheduling
    return {
        "model_path": server.model_name,
        "served_model_name": server.model_name,
        "max_running_requests": server.model.capacity,
        "max_total_num_tokens": server.max_total_tokens,
        "max_total_tokens": server.model.kv_tokens or None,
        "schedule_policy": "fcfs",
        "enable_priority_scheduling": sched.enabled,
        "disable_priority_preemption": not sched.preemption,
        "default_priority_value": sched.default_priority,
        "abort_on_priority_when_disabled": sched.abort_when_disabled,
        "schedule_low_priority_values_first": sched.low_values_first,
        "priority_scheduling_preemption_threshold": sched.preemption_threshold,
        "is_latency_model": True,
        "weight_version": "default",
        "enable_deterministic_inference": False,  # its outputs are scripted, not sampled
        "internal_states": [
            {
                "num_running_reqs": server.num_running,
                "num_waiting_reqs": server.num_waiting,
                "dp_rank": 0,
            }
        ],
    }


def _add_info_routes(app: FastAPI, server: LatencyServer) -> None:
    """Health, what is served, and the load a router balances on."""

    @app.get("/health")
    @app.get("/health_generate")
    async def health() -> Response:
        return Response(status_code=200)

    async def model_info() -> dict[str, Any]:
        return {
            "model_path": server.model_name,
            "tokenizer_path": server.model_name,
            "is_generation": True,
            "weight_version": "default",
            "has_image_understanding": False,
        }

    app.get("/model_info")(model_info)
    app.get("/get_model_info")(model_info)

    async def server_info() -> dict[str, Any]:
        return _server_info(server)

    app.get("/server_info")(server_info)
    app.get("/get_server_info")(server_info)

    @app.get("/v1/loads")
    async def v1_loads(include: str | None = None) -> Response:
        # SGLang's entrypoints/v1_loads.py: {timestamp, version, accelerator,
        # num_accelerators, loads: [per-DP-rank GetLoadsReqOutput]}.
        load = server.load()
        sections = {s.strip() for s in include.split(",")} if include else {"all"}
        if not sections & {"all", "queues"}:
            load.pop("queues")
        body = {
            "timestamp": datetime.now(UTC).isoformat(),
            "version": "latency-model",
            "accelerator": None,
            "num_accelerators": 0,
            "loads": [load],
        }
        return json_response(body)

    @app.get("/v1/models")
    async def v1_models() -> dict[str, Any]:
        card = {"id": server.model_name, "object": "model", "owned_by": "toolrollout"}
        return {"object": "list", "data": [card]}


def create_latency_app(server: LatencyServer) -> Any:
    """The FastAPI app: SGLang's native routes, OpenAI chat, and ``/bench/*`` for the harness."""
    from toolrollout.apps.server._openai import add_chat_completions

    app = FastAPI(title="toolrollout latency-model server")

    _add_info_routes(app, server)

    @app.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        body = json.loads(await request.body() or b"{}")
        rid = body.get("rid", "") if isinstance(body, dict) else ""
        abort_all = bool(body.get("abort_all", False)) if isinstance(body, dict) else False
        server.abort(str(rid), abort_all=abort_all)
        return Response(status_code=200)

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(request: Request) -> Response:
        try:
            body = json.loads(await request.body() or b"{}")
            generate_request, return_logprob, priority = _request_from_body(body)
            result = await server.generate(generate_request, priority=priority)
        except ValueError as exc:
            return error_response(f"JSON decode error: {exc}")
        except PriorityRefused as exc:
            return error_response(str(exc), HTTPStatus.SERVICE_UNAVAILABLE)
        except UserError as exc:
            return error_response(str(exc))
        return json_response(_generate_json(result, return_logprob=return_logprob))

    @app.get("/bench/log")
    async def bench_log() -> Response:
        return json_response(
            {
                "requests": server.log,
                "capacity": server.model.capacity,
                "retractions": server.retractions,
                "preemptions": server.preemptions,
            }
        )

    @app.post("/bench/reset")
    async def bench_reset() -> Response:
        server.reset()
        return Response(status_code=200)

    add_chat_completions(
        app,
        tokenizer=server.tokenizer,
        generate=server.generate,
        model_name=server.model_name,
    )
    return app


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m toolrollout.apps.bench.serve_model``: serve the latency model with uvicorn."""
    from transformers import AutoTokenizer

    from toolrollout.apps.demo import DEMO_MODEL_PATH

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--tokenizer", type=Path, default=DEMO_MODEL_PATH)
    parser.add_argument("--capacity", type=int, default=256)
    parser.add_argument("--prefill-per-token", type=float, default=0.00002)
    parser.add_argument("--decode-per-token", type=float, default=0.002)
    parser.add_argument("--max-total-tokens", type=int, default=0, help="KV budget; 0: none")
    parser.add_argument("--enable-priority-scheduling", action="store_true")
    parser.add_argument("--schedule-low-priority-values-first", action="store_true")
    parser.add_argument("--priority-scheduling-preemption-threshold", type=int, default=10)
    parser.add_argument("--abort-on-priority-when-disabled", action="store_true")
    parser.add_argument("--default-priority-value", type=int, default=None)
    parser.add_argument("--disable-priority-preemption", action="store_true")
    parser.add_argument(
        "--draw-url", default=None, help="the tool service that counts shared-prompt draws"
    )
    args = parser.parse_args(argv)
    model = LatencyModel(
        args.capacity, args.prefill_per_token, args.decode_per_token, args.max_total_tokens
    )
    scheduling = ServerScheduling(
        enabled=args.enable_priority_scheduling,
        low_values_first=args.schedule_low_priority_values_first,
        preemption_threshold=args.priority_scheduling_preemption_threshold,
        abort_when_disabled=args.abort_on_priority_when_disabled,
        default_priority=args.default_priority_value,
        preemption=not args.disable_priority_preemption,
    )
    tokenizer = AutoTokenizer.from_pretrained(str(args.tokenizer))
    server = LatencyServer(
        tokenizer, model, model_name="latency-model", scheduling=scheduling, draw_url=args.draw_url
    )
    serve(create_latency_app(server), args.host, args.port)
