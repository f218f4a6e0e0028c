"""The simulated SGLang scheduler behind the latency-model server (``_server.py``).

:class:`LatencyServer` answers each request with the scripted turn's real token ids once it
has held a batch slot for the :class:`LatencyModel`'s prefill + decode time. Its prefix
cache makes ``cached_tokens`` meaningful, and its log of every request's slot time lets the
harness bound the makespan by what the server really did.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from toolrollout._exceptions import UserError
from toolrollout.engines._types import FinishReason, GenerateRequest, GenerateResult

from ._model import LatencyModel, ServerScheduling, WorkloadGroup, WorkloadItem
from ._script import TurnScript

__all__ = ["LatencyServer"]


_MAX_CACHED_SESSIONS = 65_536
_UNLIMITED_KV_PER_SLOT = 65_536
"""``max_total_num_tokens`` reported for an unlimited KV budget: per slot, a long context."""


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
    """The simulated engine behind the HTTP app of ``_server.py`` (one event loop, no locks).

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
        self._groups: dict[str, list[int]] = {}
        self._system_prefixes: set[tuple[int, ...]] = set()
        self._seq = 0
        self._tick: asyncio.TimerHandle | None = None
        self.log: list[dict[str, Any]] = []
        self.reset()  # the counters

    # ------------------------------------------------------------------ state views
    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

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
        """Forget the request log, the prefix cache and the counters (between benchmark modes)."""
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
        for running in sorted(
            self._running.values(), key=lambda r: sched.victim_order(r.priority, r.entry)
        ):
            if slots_short <= 0 and tokens_short <= 0:
                break
            if not sched.outranks(req.priority, running.priority):
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
        queue = sorted(
            self._waiting, key=lambda r: self.scheduling.rank(r.priority, r.entry, r.seq)
        )
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
        self._unrun(req, now)
        req.decoded = len(req.output)
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
        resolved = self.scheduling.resolve(priority)
        located, turn, system_end = self.script.locate(ids)
        item = await self.draw(located) if isinstance(located, WorkloadGroup) else located
        output, finish = self.script.answer(self.script.turn(item, turn), request.sampling)
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
