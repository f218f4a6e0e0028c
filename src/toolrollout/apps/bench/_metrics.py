"""What a benchmark run is judged by, computed from the servers' own logs: the ideal
makespan, the FIFO, oracle and KV bounds and the efficiencies built on them (defined in
docs/benchmarks.md).
"""

from __future__ import annotations

import resource
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "ModeResult",
    "clock",
    "critical_paths",
    "group_completion_times",
    "group_of",
    "ideal_makespan",
    "kv_bound_makespan",
    "measured_ends",
    "orchestration_efficiency",
    "peak_in_flight",
    "replay",
    "replay_makespan",
    "since",
]


def clock() -> tuple[float, float]:
    """Wall time and this process's CPU time (user + system, all threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), usage.ru_utime + usage.ru_stime


def since(start: tuple[float, float]) -> dict[str, float]:
    """A driver's measured run from ``start``: its wall and CPU time, and when it ended."""
    wall, cpu = clock()
    return {"makespan_s": wall - start[0], "client_cpu_s": cpu - start[1], "measured_until": wall}


def critical_paths(
    requests: Iterable[Mapping[str, Any]], tool_calls: Iterable[Mapping[str, Any]]
) -> dict[str, float]:
    """Seconds per trajectory key: its requests' slot time plus its tool calls' latency.

    ``requests`` are the latency server's log entries (``key``, ``slot_seconds``);
    ``tool_calls`` the tool service's (``key`` of the form ``<trajectory>.<turn>``,
    ``seconds``).
    """
    paths: dict[str, float] = defaultdict(float)
    for request in requests:
        key = request.get("key")
        if key is not None:
            paths[str(key)] += float(request["slot_seconds"])
    for call in tool_calls:
        trajectory = str(call["key"]).rsplit(".", 1)[0]
        paths[trajectory] += float(call["seconds"])
    return dict(paths)


def ideal_makespan(paths: Mapping[str, float], total_slot_seconds: float, capacity: int) -> float:
    """``max(longest critical path, total slot time / capacity)``."""
    if capacity < 1:
        raise ValueError("capacity must be at least 1")
    longest = max(paths.values(), default=0.0)
    return max(longest, total_slot_seconds / capacity)


def kv_bound_makespan(
    requests: Iterable[Mapping[str, Any]], decode_per_token_s: float, kv_tokens: int
) -> float:
    """Seconds a server with ``kv_tokens`` of KV needs at least for the logged requests.

    A request with ``p`` prompt tokens that decodes ``o`` tokens at ``decode_per_token_s``
    holds ``p + k`` tokens of KV at its ``k``-th step, ``(p * o + o * o / 2)`` token-steps
    in all (prefill, retraction and re-prefill only add to it, so they are left out). The
    sum over requests, divided by the budget (summed over servers), bounds the makespan
    from below. 0.0 without a budget. Pass the budget the server really keeps: the
    latency-model server checks it only every few decode steps, so the harness adds
    ``LatencyModel.kv_overshoot_tokens``. Each request counts its whole context, as the
    latency-model server does; SGLang's radix tree keeps a prefix shared by running
    requests once, so on a real server the bound can be lower than this.
    """
    if kv_tokens <= 0:
        return 0.0
    steps = 0.0
    for request in requests:
        prompt = float(request["prompt_tokens"])
        output = float(request["output_tokens"])
        steps += prompt * output + output * output / 2
    return steps * decode_per_token_s / kv_tokens


def _rank(
    order: str,
    now: float,
    done: int,
    remaining: list[float],
    group_rank: dict[str, int],
    trajectory: str,
) -> float:
    """Where a trajectory that has made ``done`` model turns waits in a server's queue under
    ``order`` (lowest first; arrival order breaks ties)."""
    if order == "fifo":
        return now
    if order == "oracle":
        return -remaining[done]
    if order == "turns":  # more turns done first, then arrival
        return -done + now * 1e-9
    if order == "oldest":  # the group that arrived first, then arrival
        return group_rank[group_of(trajectory)] + now * 1e-9
    if order == "length":  # more model turns to go first, then arrival
        return done - (len(remaining) - 1) + now * 1e-9
    return done + now * 1e-9  # fewer turns done first, then arrival


def _replay_inputs(
    requests: Iterable[Mapping[str, Any]],
    tool_calls: Iterable[Mapping[str, Any]],
    order: str,
) -> tuple[
    dict[str, list[tuple[int, int, float]]],
    dict[tuple[str, int], float],
    dict[str, int],
    dict[str, list[float]],
]:
    """What :func:`replay` replays: each trajectory's steps ``(turn, server, slot
    seconds)`` in turn order, each turn's tool time (its slowest call), the groups' arrival
    ranks (for ``oldest``) and the work left from each step on."""
    requests = list(requests)
    steps: dict[str, list[tuple[int, int, float]]] = defaultdict(list)
    group_rank: dict[str, int] = {}  # for ``oldest``: groups by their first logged arrival
    if order == "oldest":
        for request in sorted(requests, key=lambda r: float(r.get("arrived", 0.0))):
            if request.get("key") is not None:
                group_rank.setdefault(group_of(str(request["key"])), len(group_rank))
    for request in requests:
        key = request.get("key")
        if key is not None:
            turn = int(request.get("turn", 0))
            steps[str(key)].append(
                (turn, int(request.get("server", 0)), float(request["slot_seconds"]))
            )
    tools: dict[tuple[str, int], float] = {}
    for call in tool_calls:
        trajectory, _, turn_text = str(call["key"]).rpartition(".")
        try:
            at = (trajectory, int(turn_text))
        except ValueError:
            continue
        tools[at] = max(tools.get(at, 0.0), float(call["seconds"]))
    for chain in steps.values():
        chain.sort(key=lambda step: step[0])
    # remaining[t][i]: work left from step i on (slot time and the tool calls after it)
    remaining: dict[str, list[float]] = {}
    for trajectory, chain in steps.items():
        left = [0.0] * (len(chain) + 1)
        for i in range(len(chain) - 1, -1, -1):
            turn, _, slot = chain[i]
            after = tools.get((trajectory, turn), 0.0) if i < len(chain) - 1 else 0.0
            left[i] = left[i + 1] + slot + after
        remaining[trajectory] = left
    return steps, tools, group_rank, remaining


def replay(
    requests: Iterable[Mapping[str, Any]],
    tool_calls: Iterable[Mapping[str, Any]],
    capacity: int,
    *,
    order: str = "fifo",
) -> dict[str, float]:
    """Each trajectory's finish time when its logged work is replayed by a zero-cost client.

    ``requests`` are the servers' log entries (``key``, ``turn``, ``slot_seconds`` and the
    ``server`` that logged it); every trajectory submits its first request at time 0, each
    later one when its previous turn's tool calls are back (calls of one turn run
    concurrently), and each server runs ``capacity`` at a time, none preempted. ``order`` is
    how a server picks from its queue (:func:`_rank`; ties in arrival order): ``fifo``
    (SGLang's default), ``oracle`` (most remaining work first, known exactly here),
    ``turns`` and ``fewest`` (most or fewest turns done first: the ``priority`` policy's
    ``turn_weight`` 1 and -1), ``length`` (most model turns to go first: a perfect ``history``
    prediction, tool latencies unknown) or ``oldest`` (the ``oldest`` policy's group order).
    """
    import heapq
    import itertools

    if capacity < 1:
        raise ValueError("capacity must be at least 1")
    if order not in ("fifo", "oracle", "turns", "fewest", "length", "oldest"):
        raise ValueError(
            f"order must be fifo, oracle, turns, fewest, length or oldest, got {order!r}"
        )
    steps, tools, group_rank, remaining = _replay_inputs(requests, tool_calls, order)
    free: dict[int, int] = defaultdict(lambda: capacity)
    queues: dict[int, list[tuple[float, int, str]]] = defaultdict(list)
    position = dict.fromkeys(steps, 0)
    events: list[tuple[float, int, str, str]] = []  # (time, seq, kind, trajectory)
    seq = itertools.count()

    def push(at: float, kind: str, trajectory: str) -> None:
        heapq.heappush(events, (at, next(seq), kind, trajectory))

    def enqueue(trajectory: str, now: float) -> int:
        _, server, _ = steps[trajectory][position[trajectory]]
        rank = _rank(
            order, now, position[trajectory], remaining[trajectory], group_rank, trajectory
        )
        heapq.heappush(queues[server], (rank, next(seq), trajectory))  # seq: arrival order
        return server

    def dispatch(server: int, now: float) -> None:
        """Fill the server's free slots from its queue, best-ranked first."""
        queue = queues[server]
        while free[server] > 0 and queue:
            _, _, waiting = heapq.heappop(queue)
            free[server] -= 1
            push(now + steps[waiting][position[waiting]][2], "done", waiting)

    for trajectory in steps:  # everything arrives at 0 and is ranked before any is served
        enqueue(trajectory, 0.0)
    for server in list(queues):
        dispatch(server, 0.0)
    ends: dict[str, float] = {}
    while events:
        now, _, kind, trajectory = heapq.heappop(events)
        if kind == "ready":
            dispatch(enqueue(trajectory, now), now)
            continue
        turn, server, _ = steps[trajectory][position[trajectory]]
        free[server] += 1
        dispatch(server, now)
        position[trajectory] += 1
        if position[trajectory] < len(steps[trajectory]):
            push(now + tools.get((trajectory, turn), 0.0), "ready", trajectory)
        else:
            ends[trajectory] = now
    return ends


def replay_makespan(
    requests: Iterable[Mapping[str, Any]],
    tool_calls: Iterable[Mapping[str, Any]],
    capacity: int,
    *,
    order: str = "fifo",
) -> float:
    """The makespan of :func:`replay`'s zero-cost client, the servers ordered by ``order``."""
    return max(replay(requests, tool_calls, capacity, order=order).values(), default=0.0)


def group_of(trajectory: str) -> str:
    """The GRPO group (prompt) of a benchmark trajectory key: ``p3`` for ``p3s7``."""
    head, sep, _ = trajectory.rpartition("s")
    return head if sep and head else trajectory


GROUP_DECILES = tuple(k / 10 for k in range(1, 11))
"""The shares of complete groups a benchmark run reports: every tenth, so that a plot can
draw the whole curve (a policy that completes groups early shows below 50%)."""


def group_completion_times(
    ends: Mapping[str, float], fractions: Iterable[float] = (0.5, 0.9, 1.0)
) -> dict[str, float]:
    """Seconds until ``fraction`` of the GRPO groups have every sample finished.

    ``ends`` maps trajectory keys to finish times (from 0). Keys of the result are the
    percentages: ``"50"``, ``"90"``, ``"100"`` by default.
    """
    import math

    done: dict[str, float] = defaultdict(float)
    for trajectory, end in ends.items():
        group = group_of(trajectory)
        done[group] = max(done[group], end)
    times = sorted(done.values())
    result: dict[str, float] = {}
    for fraction in fractions:
        label = f"{round(fraction * 100):d}"
        if not times:
            result[label] = 0.0
            continue
        index = min(max(math.ceil(fraction * len(times)) - 1, 0), len(times) - 1)
        result[label] = times[index]
    return result


def measured_ends(requests: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Each trajectory's finish time in a run, from the servers' logs: its last request's
    end, from the first request's arrival (all servers share the machine's monotonic
    clock)."""
    logged = [r for r in requests if r.get("key") is not None]
    if not logged:
        return {}
    origin = min(float(r["arrived"]) for r in logged)
    ends: dict[str, float] = defaultdict(float)
    for r in logged:
        key = str(r["key"])
        ends[key] = max(ends[key], float(r["ended"]) - origin)
    return dict(ends)


def peak_in_flight(requests: Iterable[Mapping[str, Any]]) -> int:
    """Most requests the servers held at once (arrived, not yet ended), from their logs: a
    client pool or concurrency cap below the run's demand shows up here as a ceiling."""
    events = sorted(
        [(float(r["arrived"]), 1) for r in requests] + [(float(r["ended"]), -1) for r in requests]
    )  # at a tie the end (-1) sorts first: a slot freed and taken at once is one, not two
    peak = held = 0
    for _, step in events:
        held += step
        peak = max(peak, held)
    return peak


def orchestration_efficiency(ideal: float, measured: float) -> float:
    """``ideal / measured`` (0.0 for an empty or instantaneous run)."""
    if measured <= 0:
        return 0.0
    return ideal / measured


@dataclass(frozen=True, slots=True)
class ModeResult:
    """One driver's numbers in one run."""

    mode: str
    trajectories: int
    completed: int
    turns: int
    generated_tokens: int
    makespan_s: float
    ideal_makespan_s: float
    client_cpu_s: float
    peak_rss_mb: float
    cached_tokens: int = 0
    prompt_tokens: int = 0
    tool_calls: int = 0
    """Calls the tool service answered during this mode (from its own log)."""
    note: str = ""
    fifo_makespan_s: float = 0.0
    """The FIFO bound: this mode's logged work replayed with a zero-cost client."""
    services_cpu_s: float = 0.0
    """CPU the stand-in services (latency-model servers, tool service) used in this mode:
    on a small machine they share the cores with the client (0.0 where /proc is absent)."""
    oracle_makespan_s: float = 0.0
    """The oracle bound: the logged work replayed most-remaining-work-first."""
    groups_s: dict[str, float] | None = None
    """Seconds to 50 / 90 / 100 % of the GRPO groups complete (keys "50", "90", "100")."""
    oracle_groups_s: dict[str, float] | None = None
    """The same in the oracle replay."""
    length_makespan_s: float = 0.0
    """The length replay: the logged work replayed most-model-turns-to-go first, as a
    perfect prediction of each trajectory's length would order it, tool latencies unknown
    (what the ``history`` policy aims at; a reference, not a strict bound: ties, served in
    arrival order here, are served otherwise by a live server)."""
    retractions: int = 0
    """Requests the servers retracted for KV (and priority preemptions, counted apart)."""
    preemptions: int = 0
    kv_bound_makespan_s: float = 0.0
    """The KV bound (:func:`kv_bound_makespan`): 0.0 when the servers have no KV budget."""
    lag_ms: dict[str, float] | None = None
    """The client's event-loop lag during the measured run: how late a 10 ms sleep woke up
    (keys ``samples``, ``p50``, ``p99``, ``max``; milliseconds)."""
    peak_in_flight: int = 0
    """Most requests the servers held at once in this mode (:func:`peak_in_flight`)."""
    target_s: float = 0.0
    """``oversample`` modes: seconds until the batch target was met (the batch's last
    trajectory ended); ``makespan_s`` less this is what stopping the rest took. 0.0 for
    modes that run everything."""

    @property
    def trajectories_per_s(self) -> float:
        return self.trajectories / self.makespan_s if self.makespan_s > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.makespan_s if self.makespan_s > 0 else 0.0

    @property
    def efficiency(self) -> float:
        return orchestration_efficiency(self.ideal_makespan_s, self.makespan_s)

    @property
    def client_efficiency(self) -> float:
        """FIFO bound / measured makespan (see docs/benchmarks.md)."""
        return orchestration_efficiency(self.fifo_makespan_s, self.makespan_s)

    @property
    def oracle_efficiency(self) -> float:
        """Oracle bound / measured makespan: how close to the best known ordering."""
        return orchestration_efficiency(self.oracle_makespan_s, self.makespan_s)

    @property
    def kv_efficiency(self) -> float:
        """KV bound / measured makespan (0.0 without a KV budget)."""
        return orchestration_efficiency(self.kv_bound_makespan_s, self.makespan_s)

    @property
    def cpu_per_turn_ms(self) -> float:
        return 1000.0 * self.client_cpu_s / self.turns if self.turns else 0.0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            trajectories_per_s=self.trajectories_per_s,
            tokens_per_s=self.tokens_per_s,
            efficiency=self.efficiency,
            client_efficiency=self.client_efficiency,
            oracle_efficiency=self.oracle_efficiency,
            kv_efficiency=self.kv_efficiency,
            cpu_per_turn_ms=self.cpu_per_turn_ms,
        )
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModeResult:
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in names})
