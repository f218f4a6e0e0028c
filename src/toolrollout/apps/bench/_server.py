"""The latency-model server: SGLang's ``/generate`` (and OpenAI chat) without a model.

It stands in for a GPU server so the rollout *orchestration* can be measured at a scale
(1,024 concurrent trajectories) that no CPU model reaches: every request holds one of
``capacity`` slots for the :class:`LatencyModel`'s prefill + decode time, then answers
with the scripted turn's real token ids. It keeps a per-trajectory prefix cache (so
``cached_tokens`` is meaningful and rewards sticky routing), honours ``/abort_request``
(an aborted request returns the tokens "decoded" so far), and logs every request's slot
time so the harness can compute the ideal makespan from what the server really did.

Run it with ``python -m toolrollout.apps.bench.serve_model --port 30000`` (see ``--help``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from http import HTTPStatus
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import Response

from toolrollout._exceptions import UserError
from toolrollout.engines._types import FinishReason, GenerateRequest, GenerateResult

from ._model import LatencyModel, ServerScheduling, WorkloadGroup, WorkloadItem
from ._script import TurnScript

__all__ = [
    "PRIORITY_DISABLED_MESSAGE",
    "LatencyServer",
    "PriorityRefused",
    "create_latency_app",
    "main",
]

_MAX_CACHED_SESSIONS = 65_536
_UNLIMITED_KV_PER_SLOT = 65_536
"""``max_total_num_tokens`` reported for an unlimited KV budget: per slot, a long context."""
PRIORITY_DISABLED_MESSAGE = (
    "Using priority is disabled for this server. Please send a new request without a priority."
)
"""SGLang's abort message for a priority sent to a server without priority scheduling."""


class PriorityRefused(UserError):
    """A request carried a priority to a server started with --abort-on-priority-when-disabled."""


@dataclass(slots=True, eq=False)
class _Req:
    """One request inside the simulated scheduler (SGLang's ``Req``, reduced to timing)."""

    rid: str
    key: str | None
    group: str | None
    turn: int
    ids: list[int]
    output: list[int]
    finish: FinishReason
    priority: int
    entry: float
    """Wait-queue entry time (SGLang's ``wait_queue_entry_time``): the priority tie-break."""
    seq: int
    """Arrival order in the wait queue (FCFS order; a retracted request goes to the back)."""
    done: asyncio.Future[None]
    system_end: int = 0
    cached: int = 0
    """Prefix-cache hit of the first admission (what ``meta_info.cached_tokens`` reports)."""
    decoded: int = 0
    """Output tokens decoded so far; kept across a retraction, as SGLang keeps output_ids."""
    admitted: float = 0.0
    prefill_end: float = 0.0
    timer: asyncio.TimerHandle | None = None
    first_started: float | None = None
    ended: float | None = None
    slot_seconds: float = 0.0
    retractions: int = 0
    preemptions: int = 0
    aborted: bool = False

    @property
    def context(self) -> int:
        return len(self.ids) + self.decoded


class LatencyServer:
    """The simulated engine behind the HTTP app (one event loop, no locks needed).

    Scheduling follows SGLang's scheduler (``managers/scheduler.py``, ``schedule_policy.py``,
    ``schedule_batch.py``): the wait queue is served first come, first served, or, with
    priority scheduling on, by ``(priority, wait-queue entry time)``; scheduling stops at
    the first request that does not fit (no slot, or not enough KV for its context plus
    ``new_token_ratio`` x its remaining ``max_new_tokens``), after trying to preempt running
    requests whose priority is lower by more than the threshold. With a KV budget, growing
    decodes that overflow it evict the prefix cache first, then retract running requests
    (fewest output tokens first, then the longest prompt), which re-enter the queue and
    re-prefill what the cache no longer holds.
    """

    def __init__(
        self,
        tokenizer: Any,
        model: LatencyModel,
        *,
        model_name: str,
        scheduling: ServerScheduling | None = None,
        new_token_ratio: float = 0.7,
        draw_url: str | None = None,
        draw_client: httpx.AsyncClient | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.model = model
        self.model_name = model_name
        self.scheduling = scheduling or ServerScheduling()
        self.new_token_ratio = new_token_ratio
        self.script = TurnScript(tokenizer)
        self.draw_url = draw_url.rstrip("/") if draw_url else None
        self._draw_client = draw_client
        """How ``draw_url`` is reached (made on first use unless given, as in tests)."""
        self._waiting: list[_Req] = []
        self._running: dict[str, _Req] = {}
        self._known: set[str] = set()
        self._cache: OrderedDict[str, list[int]] = OrderedDict()
        self._cache_tokens = 0
        self._groups: dict[str, list[int]] = {}
        self._system_prefixes: set[tuple[int, ...]] = set()
        self._seq = 0
        self._tick: asyncio.TimerHandle | None = None
        self.retractions = 0
        self.preemptions = 0
        self.log: list[dict[str, Any]] = []
        self._generated = 0
        self._started_at = time.perf_counter()
        self._hits = 0
        self._prompted = 0

    # ------------------------------------------------------------------ state views
    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def active(self) -> int:
        return len(self._running)

    @property
    def max_total_tokens(self) -> int:
        return self.model.kv_tokens or self.model.capacity * _UNLIMITED_KV_PER_SLOT

    def running_tokens(self, now: float | None = None) -> int:
        """KV tokens the running requests hold: each one's context, decoded tokens included."""
        at = time.perf_counter() if now is None else now
        return sum(len(r.ids) + self._decoded_at(r, at) for r in self._running.values())

    def used_tokens(self, now: float | None = None) -> int:
        """KV tokens held now: running contexts (decoded so far) plus the prefix cache."""
        return self.running_tokens(now) + self._cache_tokens

    def load(self) -> dict[str, Any]:
        """One DP rank's entry of SGLang's ``/v1/loads`` (``GetLoadsReqOutput`` fields).

        As in SGLang's scheduler (``num_used = max_total - (available + evictable)``), the
        prefix cache is not "used": a cached context no running request continues is
        evictable, and the one a running request continues is part of that request's
        context, counted there. A server whose cache fills the KV while nothing runs
        reports a usage of 0, not near 1.
        """
        now = time.perf_counter()
        used = self.running_tokens(now)
        pending = sum(r.context for r in self._waiting)
        total = self.max_total_tokens
        elapsed = max(now - self._started_at, 1e-9)
        return {
            "dp_rank": 0,
            "timestamp": time.time(),
            "num_running_reqs": self.num_running,
            "num_waiting_reqs": self.num_waiting,
            "num_used_tokens": used,
            "num_total_tokens": used + pending,
            "max_total_num_tokens": total,
            "token_usage": used / total if total else 0.0,
            "gen_throughput": self._generated / elapsed,
            "cache_hit_rate": self._hits / self._prompted if self._prompted else 0.0,
            "utilization": self.num_running / self.model.capacity,
            "max_running_requests": self.model.capacity,
            "queues": {
                "waiting": self.num_waiting,
                "grammar": 0,
                "paused": 0,
                "retracted": sum(1 for r in self._waiting if r.retractions),
            },
        }

    async def draw(self, group: WorkloadGroup) -> WorkloadItem:
        """Which sample of a shared-prompt group a first turn is. Several servers draw from
        the one counter at ``draw_url`` (the tool service), so a group's copies spread over
        them still run each sample once; one server counts on its own."""
        if self.draw_url is None:
            return self.script.draw(group)
        if self._draw_client is None:
            self._draw_client = httpx.AsyncClient(timeout=30.0)
        response = await self._draw_client.post(
            f"{self.draw_url}/bench/draw", json={"group": group.key, "samples": len(group.turns)}
        )
        response.raise_for_status()
        return group.sample(int(response.json()["index"]))

    def reset(self) -> None:
        """Forget the request log and the prefix cache (between benchmark modes)."""
        self.log.clear()
        self.script.reset()
        self._cache.clear()
        self._cache_tokens = 0
        self._groups.clear()
        self._system_prefixes.clear()
        self.retractions = 0
        self.preemptions = 0
        self._generated = 0
        self._hits = 0
        self._prompted = 0
        self._started_at = time.perf_counter()

    # ------------------------------------------------------------------ priority
    def resolve_priority(self, priority: int | None) -> int:
        """SGLang's ``_set_or_validate_priority``: the default, the refusal, or ignore."""
        sched = self.scheduling
        if not sched.enabled:
            if priority is not None and sched.abort_when_disabled:
                raise PriorityRefused(PRIORITY_DISABLED_MESSAGE)
            return 0  # ignored: every request is equal, the queue stays FCFS
        if priority is not None:
            return priority
        if sched.default_priority is not None:
            return sched.default_priority
        return sys.maxsize if sched.low_values_first else -sys.maxsize - 1

    def _rank(self, req: _Req) -> tuple[float, float]:
        """Sort key of the wait queue; smaller is served first."""
        if not self.scheduling.enabled:
            return (0.0, float(req.seq))
        sign = 1 if self.scheduling.low_values_first else -1
        return (float(req.priority * sign), req.entry)

    def _victim_order(self, req: _Req) -> tuple[float, float]:
        """SGLang's preemption order: lowest priority first, then the latest to queue."""
        sign = 1 if self.scheduling.low_values_first else -1
        return (float(req.priority * -sign), -req.entry)

    def _outranks(self, new: _Req, running: _Req) -> bool:
        sign = 1 if self.scheduling.low_values_first else -1
        diff = (new.priority - running.priority) * -sign
        return diff > self.scheduling.preemption_threshold

    # ------------------------------------------------------------------ prefix cache
    def _cached_tokens(self, req: _Req, ids: Sequence[int], system_end: int) -> int:
        cached = 0
        if system_end > 0:
            prefix = tuple(ids[:system_end])
            if prefix in self._system_prefixes:
                cached = system_end
            else:
                self._system_prefixes.add(prefix)
        if req.group is not None:
            shared = self._groups.get(req.group)
            if shared is None:
                self._groups[req.group] = list(ids)
            else:
                cached = max(cached, _common_prefix(shared, ids))
        if req.key is not None:
            previous = self._cache.get(req.key)
            if previous is not None and len(previous) <= len(ids):
                if list(ids[: len(previous)]) == previous:
                    cached = max(cached, len(previous))
                    self._cache.move_to_end(req.key)
        return min(cached, max(len(ids) - 1, 0))

    def _remember(self, key: str, ids: list[int]) -> None:
        old = self._cache.pop(key, None)
        if old is not None:
            self._cache_tokens -= len(old)
        self._cache[key] = ids
        self._cache_tokens += len(ids)
        while len(self._cache) > _MAX_CACHED_SESSIONS:
            _, evicted = self._cache.popitem(last=False)
            self._cache_tokens -= len(evicted)

    def _evict(self, need: int, now: float) -> None:
        """Drop least recently used cached contexts until ``need`` more tokens fit."""
        if not self.model.kv_tokens:
            return
        while self._cache and self.used_tokens(now) + need > self.model.kv_tokens:
            _, evicted = self._cache.popitem(last=False)
            self._cache_tokens -= len(evicted)

    # ------------------------------------------------------------------ scheduling
    def _decoded_at(self, req: _Req, now: float) -> int:
        per_token = self.model.decode_per_token_s
        if now <= req.prefill_end:
            return req.decoded
        if per_token <= 0:
            return len(req.output)
        done = req.decoded + int((now - req.prefill_end) / per_token)
        return min(done, len(req.output))

    def _reserve(self, req: _Req) -> int:
        """KV tokens admission sets aside for a request (SGLang's ``PrefillAdder`` estimate)."""
        remaining = max(len(req.output) - req.decoded, 0)
        return req.context + int(remaining * self.new_token_ratio)

    def _fits(self, req: _Req, now: float) -> bool:
        if len(self._running) >= self.model.capacity:
            return False
        if not self.model.kv_tokens:
            return True
        reserved = sum(self._reserve(r) for r in self._running.values())
        return reserved + self._reserve(req) <= self.model.kv_tokens

    def _preempt_for(self, req: _Req, now: float) -> bool:
        """SGLang's ``preempt_to_schedule``: free room for ``req`` by lower-priority requests."""
        sched = self.scheduling
        if not (sched.enabled and sched.preemption) or not self._running:
            return False
        victims: list[_Req] = []
        slots_short = len(self._running) + 1 - self.model.capacity
        tokens_short = 0
        if self.model.kv_tokens:
            reserved = sum(self._reserve(r) for r in self._running.values())
            tokens_short = reserved + self._reserve(req) - self.model.kv_tokens
        for running in sorted(self._running.values(), key=self._victim_order):
            if slots_short <= 0 and tokens_short <= 0:
                break
            if not self._outranks(req, running):
                break
            victims.append(running)
            slots_short -= 1
            tokens_short -= self._reserve(running)
        if not victims or slots_short > 0 or tokens_short > 0:
            return False
        for victim in victims:
            victim.preemptions += 1
            self.preemptions += 1
            self._retract(victim, now)
        return True

    def _unrun(self, req: _Req, now: float) -> None:
        """Take a running request off its slot, counting what it decoded and its time."""
        req.decoded = self._decoded_at(req, now)
        if req.timer is not None:
            req.timer.cancel()
            req.timer = None
        req.slot_seconds += now - req.admitted
        del self._running[req.rid]

    def _retract(self, req: _Req, now: float) -> None:
        """Stop a running request; it keeps its output and waits to be re-prefilled."""
        self._unrun(req, now)
        self._seq += 1
        req.seq = self._seq
        self._waiting.append(req)

    def _check_kv(self, now: float) -> None:
        """SGLang's ``retract_decode``: when decodes outgrow the KV, retract some of them."""
        budget = self.model.kv_tokens
        if not budget or self.used_tokens(now) <= budget:
            return
        self._evict(0, now)
        order = sorted(
            self._running.values(),
            key=lambda r: (self._decoded_at(r, now), -len(r.ids)),
            reverse=True,
        )
        while len(order) > 1 and self.used_tokens(now) > budget:
            victim = order.pop()
            victim.retractions += 1
            self.retractions += 1
            self._retract(victim, now)

    def _admit(self, req: _Req, now: float) -> None:
        context = req.ids + req.output[: req.decoded]
        if req.first_started is None:
            cached = self._cached_tokens(req, req.ids, req.system_end)
            req.cached = cached
            req.first_started = now
            self._prompted += len(req.ids)
            self._hits += cached
        else:  # a retracted request: what of its context the cache still holds
            cached = 0
            if req.key is not None:
                previous = self._cache.get(req.key)
                if previous is not None and context[: len(previous)] == previous:
                    cached = len(previous)
        prefill = max(len(context) - cached, 0) * self.model.prefill_per_token_s
        decode = (len(req.output) - req.decoded) * self.model.decode_per_token_s
        self._evict(self._reserve(req), now)
        req.admitted = now
        req.prefill_end = now + prefill
        self._running[req.rid] = req
        loop = asyncio.get_running_loop()
        req.timer = loop.call_at(loop.time() + prefill + decode, self._complete, req)

    def _schedule(self) -> None:
        now = time.perf_counter()
        self._check_kv(now)
        if not self._waiting:
            return
        queue = sorted(self._waiting, key=self._rank)
        self._waiting = []  # preempted requests join it while the queue is walked
        admitted = 0
        for req in queue:
            if not self._fits(req, now) and not self._preempt_for(req, now):
                break  # SGLang stops at the first request that cannot be added
            self._admit(req, now)
            admitted += 1
        self._waiting = queue[admitted:] + self._waiting
        self._arm_tick()

    def _arm_tick(self) -> None:
        """With a KV budget, re-check growing decodes every few decode steps."""
        if not self.model.kv_tokens or self._tick is not None or not self._running:
            return
        interval = self.model.kv_check_seconds
        self._tick = asyncio.get_running_loop().call_later(interval, self._on_tick)

    def _on_tick(self) -> None:
        self._tick = None
        self._schedule()
        self._arm_tick()

    def _complete(self, req: _Req) -> None:
        now = time.perf_counter()
        req.timer = None
        req.slot_seconds += now - req.admitted
        req.decoded = len(req.output)
        self._running.pop(req.rid, None)
        req.ended = now
        self._generated += len(req.output)
        if req.key is not None:
            self._remember(req.key, req.ids + req.output)
            self._evict(0, now)  # the cache lives inside the KV pool, never beyond it
        if not req.done.done():
            req.done.set_result(None)
        self._schedule()

    def abort(self, rid: str, *, abort_all: bool = False) -> int:
        """Abort requests whose id starts with ``rid`` (SGLang matches prefixes)."""
        now = time.perf_counter()
        hit = 0
        for req in [*self._running.values(), *self._waiting]:
            if not (abort_all or (rid and req.rid.startswith(rid))):
                continue
            hit += 1
            if req.rid in self._running:
                self._unrun(req, now)
            else:
                self._waiting.remove(req)
            req.aborted = True
            req.ended = now
            if not req.done.done():
                req.done.set_result(None)
        if hit:
            self._schedule()
        return hit

    async def generate(
        self, request: GenerateRequest, *, priority: int | None = None
    ) -> GenerateResult:
        """Answer one request once the simulated scheduler has served it."""
        ids = list(request.input_ids)
        if not ids:
            raise UserError("input_ids is empty")
        rid = request.rid or uuid.uuid4().hex
        if rid in self._known:
            raise UserError(f"Duplicate request ID detected: {rid}")
        resolved = self.resolve_priority(priority)
        located, turn, system_end = self.script.locate(ids)
        item = await self.draw(located) if isinstance(located, WorkloadGroup) else located
        scripted = self.script.turn(item, turn)
        output = self.script.output_ids(scripted.text)
        max_new = request.sampling.max_new_tokens
        finish = FinishReason("stop", matched=self.script.im_end)
        if request.sampling.ignore_eos:  # SGLang decodes max_new_tokens whatever it samples
            output = (output * (max_new // max(len(output), 1) + 1))[:max_new] or [0] * max_new
        if len(output) > max_new or request.sampling.ignore_eos:
            output = output[:max_new]
            finish = FinishReason("length", length=max_new)
        arrived = time.perf_counter()
        self._seq += 1
        req = _Req(
            rid=rid,
            key=item.key if item is not None else None,
            group=item.group if item is not None else None,
            turn=turn,
            ids=ids,
            output=output,
            finish=finish,
            priority=resolved,
            entry=arrived,
            seq=self._seq,
            done=asyncio.get_running_loop().create_future(),
            system_end=system_end,
        )
        self._known.add(rid)
        try:
            self._waiting.append(req)
            self._schedule()
            await req.done
        finally:
            self._known.discard(rid)
            if not req.done.done():  # the HTTP request was cancelled: drop it
                self.abort(rid)
        ended = req.ended if req.ended is not None else time.perf_counter()
        if req.aborted:
            output = output[: max(min(req.decoded, len(output) - 1), 0)]
            finish = FinishReason("abort", message="Abort request by user")
        self.log.append(
            {
                "key": req.key,
                "turn": turn,
                "arrived": arrived,
                "started": req.first_started,
                "ended": ended,
                "slot_seconds": req.slot_seconds,
                "prompt_tokens": len(ids),
                "cached_tokens": req.cached,
                "output_tokens": len(output),
                "finish": finish.type,
                "priority": priority,
                "retractions": req.retractions,
                "preemptions": req.preemptions,
            }
        )
        return GenerateResult(
            rid=rid,
            output_ids=tuple(output),
            output_logprobs=tuple(-0.25 for _ in output),
            finish_reason=finish,
            prompt_tokens=len(ids),
            completion_tokens=len(output),
            cached_tokens=req.cached,
            text=self.tokenizer.decode(output, skip_special_tokens=False),
            e2e_latency=ended - arrived,
        )


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


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


def _json(content: Any, status_code: int = 200) -> Response:
    return Response(
        json.dumps(content, separators=(",", ":")),
        status_code=status_code,
        media_type="application/json",
    )


def _error(message: str, status_code: int = HTTPStatus.BAD_REQUEST) -> Response:
    return _json({"error": {"message": message}}, status_code)


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
        return _json(body)

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
            return _error(f"JSON decode error: {exc}")
        except PriorityRefused as exc:
            return _error(str(exc), HTTPStatus.SERVICE_UNAVAILABLE)
        except UserError as exc:
            return _error(str(exc))
        return _json(_generate_json(result, return_logprob=return_logprob))

    @app.get("/bench/log")
    async def bench_log() -> Response:
        return _json(
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
        error_response=_error,
        json_response=_json,
    )
    return app


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m toolrollout.apps.bench.serve_model``: serve the latency model with uvicorn."""
    import uvicorn
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
