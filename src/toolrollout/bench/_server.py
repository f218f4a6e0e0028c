"""The latency-model server: SGLang's ``/generate`` (and OpenAI chat) without a model.

It stands in for a GPU server so the rollout *orchestration* can be measured at a scale
(1,024 concurrent trajectories) that no CPU model reaches: every request holds one of
``capacity`` slots for the :class:`LatencyModel`'s prefill + decode time, then answers
with the scripted turn's real token ids. It keeps a per-trajectory prefix cache (so
``cached_tokens`` is meaningful and rewards sticky routing), honours ``/abort_request``
(an aborted request returns the tokens "decoded" so far), and logs every request's slot
time so the harness can compute the ideal makespan from what the server really did.

Run it with ``python -m toolrollout.bench.serve_model --port 30000`` (see ``--help``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from toolrollout._exceptions import UserError
from toolrollout.engines._types import FinishReason, GenerateRequest, GenerateResult

from ._model import LatencyModel
from ._script import TurnScript

__all__ = ["LatencyServer", "create_latency_app", "main"]

_MAX_CACHED_SESSIONS = 65_536


@dataclass(slots=True)
class _Running:
    abort: asyncio.Event
    started: float | None = None


class LatencyServer:
    """The simulated engine behind the HTTP app (one event loop, no locks needed)."""

    def __init__(self, tokenizer: Any, model: LatencyModel, *, model_name: str) -> None:
        self.tokenizer = tokenizer
        self.model = model
        self.model_name = model_name
        self.script = TurnScript(tokenizer)
        self._slots = asyncio.Semaphore(model.capacity)
        self._running: dict[str, _Running] = {}
        self._cache: OrderedDict[str, list[int]] = OrderedDict()
        self._system_prefixes: set[tuple[int, ...]] = set()
        self.active = 0
        self.log: list[dict[str, Any]] = []

    @property
    def num_running(self) -> int:
        return sum(1 for r in self._running.values() if r.started is not None)

    @property
    def num_waiting(self) -> int:
        return len(self._running) - self.num_running

    def reset(self) -> None:
        """Forget the request log and the prefix cache (between benchmark modes)."""
        self.log.clear()
        self._cache.clear()
        self._system_prefixes.clear()

    def abort(self, rid: str, *, abort_all: bool = False) -> int:
        """Abort running requests whose id starts with ``rid`` (SGLang matches prefixes)."""
        hit = 0
        for key, running in self._running.items():
            if abort_all or (rid and key.startswith(rid)):
                running.abort.set()
                hit += 1
        return hit

    def _cached_tokens(self, key: str | None, ids: Sequence[int], system_end: int) -> int:
        cached = 0
        if system_end > 0:
            prefix = tuple(ids[:system_end])
            if prefix in self._system_prefixes:
                cached = system_end
            else:
                self._system_prefixes.add(prefix)
        if key is not None:
            previous = self._cache.get(key)
            if previous is not None and len(previous) <= len(ids):
                if list(ids[: len(previous)]) == previous:
                    cached = max(cached, len(previous))
        return min(cached, max(len(ids) - 1, 0))

    def _remember(self, key: str, ids: list[int]) -> None:
        self._cache[key] = ids
        self._cache.move_to_end(key)
        while len(self._cache) > _MAX_CACHED_SESSIONS:
            self._cache.popitem(last=False)

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Answer one request after its simulated slot time."""
        ids = list(request.input_ids)
        if not ids:
            raise UserError("input_ids is empty")
        rid = request.rid or uuid.uuid4().hex
        if rid in self._running:
            raise UserError(f"Duplicate request ID detected: {rid}")
        item, turn, system_end = self.script.locate(ids)
        scripted = self.script.turn(item, turn)
        output = self.script.output_ids(scripted.text)
        max_new = request.sampling.max_new_tokens
        finish = FinishReason("stop", matched=self.script.im_end)
        if len(output) > max_new:
            output = output[:max_new]
            finish = FinishReason("length", length=max_new)
        key = item.key if item is not None else None
        cached = self._cached_tokens(key, ids, system_end)
        service = self.model.service_seconds(len(ids) - cached, len(output))
        arrived = time.perf_counter()
        running = _Running(asyncio.Event())
        self._running[rid] = running
        try:
            async with self._slots:
                running.started = time.perf_counter()
                self.active += 1
                try:
                    try:
                        await asyncio.wait_for(running.abort.wait(), service)
                    except TimeoutError:
                        pass
                    else:
                        elapsed = time.perf_counter() - running.started
                        decoded = elapsed - (len(ids) - cached) * self.model.prefill_per_token_s
                        per_token = self.model.decode_per_token_s
                        done = int(decoded / per_token) if per_token > 0 else 0
                        output = output[: max(min(done, len(output) - 1), 0)]
                        finish = FinishReason("abort", message="Abort request by user")
                finally:
                    self.active -= 1
                ended = time.perf_counter()
        finally:
            del self._running[rid]
        if key is not None and finish.type != "abort":
            self._remember(key, ids + output)
        self.log.append(
            {
                "key": key,
                "turn": turn,
                "arrived": arrived,
                "started": running.started,
                "ended": ended,
                "slot_seconds": ended - (running.started or ended),
                "prompt_tokens": len(ids),
                "cached_tokens": cached,
                "output_tokens": len(output),
                "finish": finish.type,
            }
        )
        return GenerateResult(
            rid=rid,
            output_ids=tuple(output),
            output_logprobs=tuple(-0.25 for _ in output),
            finish_reason=finish,
            prompt_tokens=len(ids),
            completion_tokens=len(output),
            cached_tokens=cached,
            text=self.tokenizer.decode(output, skip_special_tokens=False),
            e2e_latency=ended - arrived,
        )


def _generate_json(result: GenerateResult, *, return_logprob: bool) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": result.rid,
        "finish_reason": result.finish_reason.to_sglang(),
        "prompt_tokens": result.prompt_tokens,
        "weight_version": "default",
        "completion_tokens": result.completion_tokens,
        "cached_tokens": result.cached_tokens,
        "e2e_latency": result.e2e_latency,
    }
    if return_logprob and result.output_logprobs is not None:
        meta["output_token_logprobs"] = [
            [lp, token, None]
            for lp, token in zip(result.output_logprobs, result.output_ids, strict=True)
        ]
    return {"text": result.text, "output_ids": list(result.output_ids), "meta_info": meta}


def _request_from_body(body: Any) -> tuple[GenerateRequest, bool]:
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
    request = GenerateRequest(
        input_ids=tuple(ids),
        sampling=SamplingParams(max_new_tokens=max_new),
        rid=rid if isinstance(rid, str) else None,
    )
    return request, bool(body.get("return_logprob", False))


def create_latency_app(server: LatencyServer) -> Any:
    """The FastAPI app: SGLang's native routes, OpenAI chat, and ``/bench/*`` for the harness."""
    from toolrollout.server._openai import add_chat_completions

    app = FastAPI(title="toolrollout latency-model server")

    def _json(content: Any, status_code: int = 200) -> Response:
        return Response(
            json.dumps(content, separators=(",", ":")),
            status_code=status_code,
            media_type="application/json",
        )

    def _error(message: str, status_code: int = HTTPStatus.BAD_REQUEST) -> Response:
        return _json({"error": {"message": message}}, status_code)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/health_generate")
    async def health_generate() -> Response:
        return Response(status_code=200)

    async def model_info() -> dict[str, Any]:
        return {
            "model_path": server.model_name,
            "tokenizer_path": server.model_name,
            "is_generation": True,
            "weight_version": "default",
        }

    app.get("/model_info")(model_info)
    app.get("/get_model_info")(model_info)

    async def server_info() -> dict[str, Any]:
        return {
            "model_path": server.model_name,
            "served_model_name": server.model_name,
            "max_running_requests": server.model.capacity,
            "is_latency_model": True,
            "internal_states": [
                {
                    "num_running_reqs": server.num_running,
                    "num_waiting_reqs": server.num_waiting,
                    "dp_rank": 0,
                }
            ],
        }

    app.get("/server_info")(server_info)
    app.get("/get_server_info")(server_info)

    @app.get("/v1/models")
    async def v1_models() -> dict[str, Any]:
        card = {"id": server.model_name, "object": "model", "owned_by": "toolrollout"}
        return {"object": "list", "data": [card]}

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
            generate_request, return_logprob = _request_from_body(body)
            result = await server.generate(generate_request)
        except ValueError as exc:
            return _error(f"JSON decode error: {exc}")
        except UserError as exc:
            return _error(str(exc))
        return _json(_generate_json(result, return_logprob=return_logprob))

    @app.get("/bench/log")
    async def bench_log() -> Response:
        return _json({"requests": server.log, "capacity": server.model.capacity})

    @app.post("/bench/reset")
    async def bench_reset() -> Response:
        server.reset()
        return Response(status_code=200)

    add_chat_completions(
        app,
        tokenizer=server.tokenizer,
        generate=server.generate,
        model_name=server.model_name,
        error_response=_error,
        json_response=_json,
    )
    return app


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m toolrollout.bench.serve_model``: serve the latency model with uvicorn."""
    import uvicorn
    from transformers import AutoTokenizer

    from toolrollout.demo import DEMO_MODEL_PATH

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--tokenizer", type=Path, default=DEMO_MODEL_PATH)
    parser.add_argument("--capacity", type=int, default=256)
    parser.add_argument("--prefill-per-token", type=float, default=0.00002)
    parser.add_argument("--decode-per-token", type=float, default=0.002)
    args = parser.parse_args(argv)
    model = LatencyModel(args.capacity, args.prefill_per_token, args.decode_per_token)
    tokenizer = AutoTokenizer.from_pretrained(str(args.tokenizer))
    server = LatencyServer(tokenizer, model, model_name="latency-model")
    app = create_latency_app(server)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        backlog=4096,
        timeout_keep_alive=30,
    )
