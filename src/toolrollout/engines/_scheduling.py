"""Client-side scheduling policies for a rollout against SGLang servers (off by default).

Each of ``priority``, ``admission``, ``lag``, ``oldest``, ``affinity`` and ``history`` is
switched on in :class:`SchedulingConfig` (``RolloutConfig.scheduling``); what each does
and when to use it: docs/scheduling.md.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import json
import math
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from typing import Any, Protocol

import anyio

from ._admission import AdmissionControl, LagAdmission
from ._limiter import OrderedLimiter
from ._priority import PriorityPolicy, ServerPriority, WorkHistory
from ._scheduling_config import SchedulingConfig
from ._types import GenerateRequest

__all__ = ["Scheduler", "SchedulingConfig", "TrajectoryView"]


class _Prompt(Protocol):
    @property
    def messages(self) -> Sequence[Mapping[str, Any]]: ...
    @property
    def metadata(self) -> Mapping[str, Any]: ...


def prompt_digest(messages: Sequence[Mapping[str, Any]]) -> str:
    """A short stable id of a prompt's messages (the history's key when rows carry none)."""
    text = json.dumps(list(messages), sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


class TrajectoryView(Protocol):
    """What the policies read of a trajectory (the rollout's ``TrajectoryState`` has it)."""

    @property
    def uid(self) -> str: ...
    @property
    def group_id(self) -> str: ...
    @property
    def num_turns(self) -> int: ...
    @property
    def prompt(self) -> _Prompt: ...


_OWN_LENGTH = frozenset({"completed", "truncated"})


def _levels_within(config: SchedulingConfig, server: ServerPriority) -> int:
    """``oldest_levels``, lowered where the servers would preempt at a smaller difference:
    the bands then reorder their queues and never preempt."""
    threshold = server.preemption_threshold
    if threshold is None:
        return config.oldest_levels
    return max(0, min(config.oldest_levels, threshold))


class Scheduler:
    """The policies of one rollout run, applied to each request before it is sent."""

    def __init__(
        self,
        config: SchedulingConfig,
        engine: Any,
        *,
        group_size: int = 1,
        ceiling: int = 256,
        http: Any = None,
        history: WorkHistory | None = None,
    ) -> None:
        self.config = config
        self.engine = engine
        self.group_size = group_size
        self.urls: tuple[str, ...] = tuple(getattr(engine, "base_urls", ()) or ())
        self.priority = PriorityPolicy(config, history=history) if config.priority else None
        self._prompt_keys: dict[str, str] = {}
        self.admission = AdmissionControl(config, ceiling) if config.admission else None
        self.lag = LagAdmission(config, ceiling) if config.lag else None
        self._http = http
        self._server_priority: ServerPriority | None = None
        self._probe_lock = anyio.Lock()
        self._last_poll = -math.inf
        self._polling = False
        self._group_ranks: dict[str, int] = {}
        self._open_ranks: list[int] = []
        """The ranks of the groups that have not completed, in order."""

    # ------------------------------------------------------------------ server facts
    async def _get_json(self, url: str, method: str, path: str) -> dict[str, Any]:
        """The engine's own ``method(url)`` when it has one (and no client was given), else
        ``GET url + path``; a body that is not an object reads as ``{}``."""
        call = getattr(self.engine, method, None)
        if call is not None and self._http is None:  # the engine's own transport
            body = await call(url)
        elif self._http is not None:
            response = await self._http.get(url + path)
            response.raise_for_status()
            body = response.json()
        else:
            import httpx

            async with httpx.AsyncClient(timeout=10.0) as http:
                response = await http.get(url + path)
                response.raise_for_status()
                body = response.json()
        return body if isinstance(body, dict) else {}

    async def server_priority(self) -> ServerPriority:
        """Priority scheduling as every server reports it (enabled only if all say so)."""
        if self._server_priority is not None:
            return self._server_priority
        async with self._probe_lock:
            if self._server_priority is None:
                found = ServerPriority(False)
                if self.urls:
                    reports = []
                    for url in self.urls:
                        try:
                            info = await self._get_json(url, "server_info", "/server_info")
                        except Exception:  # no report: assume the feature is off
                            info = {}
                        reports.append(ServerPriority.from_server_info(info))
                    signs = {r.low_values_first for r in reports}
                    if all(r.enabled for r in reports) and len(signs) == 1:
                        thresholds = [r.preemption_threshold for r in reports]
                        known = [t for t in thresholds if t is not None]
                        found = replace(
                            reports[0], preemption_threshold=min(known) if known else None
                        )
                self._server_priority = found
        return self._server_priority

    async def _poll_loads(self, limiter: OrderedLimiter) -> None:
        if self.admission is None or self._polling or not self.urls:
            return
        now = time.monotonic()
        if now - self._last_poll < self.config.poll_s:
            return
        self._polling = True
        self._last_poll = now
        try:
            loads: list[dict[str, Any]] = []
            for url in self.urls:
                try:
                    body = await self._get_json(url, "get_loads", "/v1/loads?include=core,queues")
                except Exception:  # a server without the route: keep the current limit
                    continue
                loads.extend(body.get("loads") or [])
            self.admission.update(loads)
            self.apply_limits(limiter)
        finally:
            self._polling = False

    def apply_limits(self, limiter: OrderedLimiter) -> None:
        """Set the run's engine limiter to the tightest of the admission policies' limits."""
        limits = [p.limit for p in (self.admission, self.lag) if p is not None]
        if limits and min(limits) != limiter.total_tokens:
            limiter.total_tokens = min(limits)

    @contextlib.asynccontextmanager
    async def watching(self, limiter: OrderedLimiter) -> AsyncIterator[None]:
        """While the block runs, the ``lag`` policy probes the loop and sets ``limiter``."""
        lag = self.lag
        if lag is None:
            yield
            return
        async with anyio.create_task_group() as tg:
            tg.start_soon(lag.watch, lambda: self.apply_limits(limiter))
            try:
                yield
            finally:
                tg.cancel_scope.cancel()

    # ------------------------------------------------------------------ per request
    def group_of(self, state: TrajectoryView) -> str:
        """The GRPO group of a trajectory (see :attr:`SchedulingConfig.group_key`)."""
        key = self.config.group_key
        if key is not None:
            value = state.prompt.metadata.get(key)
            if value is not None:
                return str(value)
        return state.group_id

    def prompt_key(self, state: TrajectoryView) -> str | None:
        """The key of the trajectory's prompt in the history (None without one)."""
        if self.priority is None or self.priority.history is None:
            return None
        key = self._prompt_keys.get(state.uid)
        if key is None:
            field = self.config.history_key
            value = state.prompt.metadata.get(field) if field is not None else None
            key = str(value) if value is not None else prompt_digest(state.prompt.messages)
            self._prompt_keys[state.uid] = key
        return key

    async def prepare(
        self, request: GenerateRequest, state: TrajectoryView, limiter: OrderedLimiter
    ) -> GenerateRequest:
        """The request as the policies want it sent (priority set, session bound)."""
        if self.config.affinity and state.num_turns == 0 and request.session_id is not None:
            bind = getattr(self.engine, "bind_group", None)
            if bind is not None:
                bind(request.session_id, self.group_of(state))
        if self.admission is not None:
            await self._poll_loads(limiter)
        if self.priority is not None:
            server = await self.server_priority()
            if server.enabled:
                value = self.priority.urgency(
                    state.uid,
                    self.group_of(state),
                    state.num_turns,
                    self.group_size,
                    self.prompt_key(state),
                    self.age_band(state, _levels_within(self.config, server))
                    if self.config.oldest
                    else None,
                )
                return replace(request, priority=-value if server.low_values_first else value)
        return request

    def slot(
        self, state: TrajectoryView, limiter: OrderedLimiter
    ) -> AbstractAsyncContextManager[None]:
        """A slot of the run's limiter for the trajectory's next request: with ``oldest``,
        in the order its group first asked for one (groups that started first, first)."""
        if not self.config.oldest:
            return limiter
        return limiter.ordered(self.group_rank(state))

    def group_rank(self, state: TrajectoryView) -> int:
        """The trajectory's GRPO group, numbered in the order the groups first asked."""
        group = self.group_of(state)
        rank = self._group_ranks.get(group)
        if rank is None:
            rank = self._group_ranks[group] = len(self._group_ranks)
            self._open_ranks.append(rank)  # ranks only grow: the list stays sorted
        return rank

    def age_band(self, state: TrajectoryView, levels: int | None = None) -> int:
        """The trajectory's group's age band among the groups not completed: ``levels`` for
        the oldest, 0 for the youngest (``oldest_levels`` unless given)."""
        ahead = bisect.bisect_left(self._open_ranks, self.group_rank(state))
        top = self.config.oldest_levels if levels is None else levels
        return max(0, top - ahead * (top + 1) // max(len(self._open_ranks), 1))

    def finished(self, state: TrajectoryView) -> None:
        """A trajectory ended: its group is nearer completion, and a length it reached on its
        own (not failed or aborted) joins its prompt's history."""
        if self.priority is not None:
            key = self.prompt_key(state)
            self._prompt_keys.pop(state.uid, None)
            if str(getattr(state, "status", "completed")) not in _OWN_LENGTH:
                key = None
            group = self.group_of(state)
            if self.priority.finished(state.uid, group, state.num_turns, key, self.group_size):
                rank = self._group_ranks.get(group)
                at = bisect.bisect_left(self._open_ranks, rank) if rank is not None else -1
                if 0 <= at < len(self._open_ranks) and self._open_ranks[at] == rank:
                    del self._open_ranks[at]
